package services

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// backend is a netwarden NetworkPolicy backend (as in test/e2e).
type backend struct {
	name string // what the agent reports
	flag string // --backend
	mode string // $NETWARDEN_IPTABLES_MODE
}

var (
	nftablesBackend = backend{name: "nftables", flag: "nftables"}
	// iptables-nft and -legacy: kube-proxy's iptables mode uses the same variant (a host has
	// one).
	iptablesNFT    = backend{name: "iptables-nft", flag: "iptables", mode: "nft"}
	iptablesLegacy = backend{name: "iptables-legacy", flag: "iptables", mode: "legacy"}

	allBackends = []backend{nftablesBackend, iptablesNFT, iptablesLegacy}
)

// agentBinary returns the agent binary wrapped to use be (simnode.BackendBinary).
func agentBinary(t *testing.T, be backend) string {
	t.Helper()
	bin, err := simnode.BackendBinary(be.flag, be.mode)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip("skipping: " + err.Error())
	}
	return bin
}

// nodeAgent is the netwarden agent of one node, reading the API server.
type nodeAgent struct {
	name string
	sock string
	node *testbed.Node
	cmd  *exec.Cmd
	done chan struct{}
	logs lockedBuffer
}

// startAgent runs the agent in node's netns as nodeName, with --kubeconfig reaching srv
// through a forwarder of its own in that netns. t.Cleanup stops it (and logs its output when
// the test failed).
func startAgent(t *testing.T, be backend, srv *kubetest.Server, node *testbed.Node, nodeName string) *nodeAgent {
	t.Helper()
	dir := t.TempDir()
	fwd, err := node.Forward("127.0.0.1:0", strings.TrimPrefix(srv.URL, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["k"] = &clientcmdapi.Cluster{Server: "https://" + fwd.Addr().String(), CertificateAuthorityData: srv.CACert}
	cfg.AuthInfos["k"] = &clientcmdapi.AuthInfo{Token: srv.AdminToken}
	cfg.Contexts["k"] = &clientcmdapi.Context{Cluster: "k", AuthInfo: "k"}
	cfg.CurrentContext = "k"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "nwsvc-")
	if err != nil {
		t.Fatal(err)
	}
	a := &nodeAgent{name: nodeName, node: node, sock: filepath.Join(sockDir, "agent.sock"), done: make(chan struct{})}
	a.cmd = exec.Command("ip", "netns", "exec", node.NetNSName, agentBinary(t, be), "agent",
		"--node-name", nodeName, "--kubeconfig", kubeconfig, "--health-addr", "unix:"+a.sock,
		"--masquerade=false", "--log-level", "debug")
	a.cmd.Stdout, a.cmd.Stderr = &a.logs, &a.logs
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	kubetest.OnSpawnThread(func() { err = a.cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
		}
		fwd.Close()
		os.RemoveAll(sockDir)
		if t.Failed() {
			t.Logf("agent of %s log (last lines):\n%s", nodeName, tail(a.logs.String(), 60))
		}
	})
	return a
}

// waitCovers waits until the agent's status covers every resource at its resourceVersion.
// It reads /status (a fact the agent reports), at a poll interval.
func (a *nodeAgent) waitCovers(timeout time.Duration, rvs map[string]uint64) error {
	deadline := time.Now().Add(timeout)
	var resources []string
	for r := range rvs {
		resources = append(resources, r)
	}
	var last statusapi.Status
	var lastErr error
	for {
		select {
		case <-a.done:
			return fmt.Errorf("agent of %s exited:\n%s", a.name, tail(a.logs.String(), 40))
		default:
		}
		st, err := statusapi.UnixClient(a.sock).Read(statusapi.Query{Resources: resources})
		if err == nil {
			ok := true
			for r, rv := range rvs {
				ok = ok && statusapi.CoversResource(st, r, rv)
			}
			if ok {
				return nil
			}
			last = st
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("agent of %s did not apply %v within %v (last error %v, status %+v):\n%s", a.name, rvs, timeout, lastErr, last, tail(a.logs.String(), 40))
		}
		time.Sleep(10 * time.Millisecond) // a poll interval
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// identPort is where every pod (and the nodes, on their underlay addresses) run a server that
// answers each connection with its own name: a probe knows which endpoint it reached.
const identPort = 8080

// serveIdent listens on identPort of every address in ips inside the namespace run enters
// (Pod.InNetNSGo, Node.InNetNSGo) and answers every connection with "name\n". It stops at
// t's cleanup.
func serveIdent(t *testing.T, name string, ips []netip.Addr, run func(func() error) error) {
	t.Helper()
	var lns []net.Listener
	if err := run(func() error {
		for _, ip := range ips {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, identPort).String())
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	}); err != nil {
		t.Fatalf("ident server %s: %v", name, err)
	}
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				go func() {
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					_, _ = io.WriteString(c, name+"\n")
				}()
			}
		}()
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		wg.Wait()
	})
}

// dialIdent connects from the namespace run enters (from src when valid) to dst and returns
// the name the server answered with.
func dialIdent(ctx context.Context, run func(func() error) error, src netip.Addr, dst netip.AddrPort, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var conn net.Conn
	err := run(func() error {
		d := net.Dialer{}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		var err error
		conn, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}
