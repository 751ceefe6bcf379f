// Package simnode runs the real netwarden agent binary against a testbed node: it writes the
// cluster state as manifests, starts the agent inside the node's network namespace, waits for
// it to apply each change (the agent's own word, its /status read with internal/statusapi),
// and probes reachability. End-to-end tests and the demo share it.
package simnode

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// Options configure a Sim.
type Options struct {
	Bed testbed.Config
	// NodeName is this node's name in the cluster state; default "node-1".
	NodeName string
	// AgentBin is the netwarden binary; default $NETWARDEN_BIN, then "netwarden" in PATH.
	AgentBin string
}

// Sim is one simulated node running the agent.
type Sim struct {
	Bed      *testbed.Bed
	Dir      string // the manifests directory the agent watches
	NodeName string
	bin      string
	// sockDir holds the unix socket of the agent's health server, through which Status reads
	// what the agent has applied: a unix socket is reachable from outside the node's netns.
	sockDir string
	// healthAddr is where the running agent serves its health endpoints: unix:PATH, or
	// HOST:PORT inside the node netns.
	healthAddr string
	// wrote maps each manifest file this Sim wrote to the hex SHA-256 of its content, or to ""
	// once removed: the agent has applied the writes when its Revision agrees.
	wrote map[string]string

	mu      sync.Mutex
	agent   *exec.Cmd
	log     bytes.Buffer
	exited  chan struct{}
	waitErr error
	closers []io.Closer
	// forwardedDown and forwardedUp count the bytes ForwardFromNode carried (ForwardedBytes).
	forwardedDown, forwardedUp atomic.Int64
}

// New creates the test bed and an empty manifests directory.
func New(opts Options) (*Sim, error) {
	if opts.NodeName == "" {
		opts.NodeName = "node-1"
	}
	bin := opts.AgentBin
	if bin == "" {
		var err error
		if bin, err = AgentBinary(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "netwarden-manifests-")
	if err != nil {
		return nil, err
	}
	sockDir, err := os.MkdirTemp("", "netwarden-sock-")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	bed, err := testbed.New(opts.Bed)
	if err != nil {
		os.RemoveAll(dir)
		os.RemoveAll(sockDir)
		return nil, err
	}
	return &Sim{Bed: bed, Dir: dir, NodeName: opts.NodeName, bin: bin, sockDir: sockDir, wrote: map[string]string{}}, nil
}

// Close stops the agent and removes the namespaces and the manifests directory.
func (s *Sim) Close() error {
	s.StopAgent()
	for _, c := range s.closers {
		c.Close()
	}
	err := s.Bed.Close()
	os.RemoveAll(s.Dir)
	os.RemoveAll(s.sockDir)
	return err
}

// AddPod creates a pod network namespace and returns the Pod object describing it, scheduled
// on this node, Running, with the IPs the test bed gave it.
func (s *Sim) AddPod(namespace, name string, labels map[string]string, ports ...corev1.ContainerPort) (*corev1.Pod, *testbed.Pod, error) {
	tp, err := s.Bed.AddPod(namespace, name)
	if err != nil {
		return nil, nil, err
	}
	return PodObject(namespace, name, s.NodeName, labels, tp.IPs(), ports...), tp, nil
}

// FlushConntrack forgets every tracked flow in the node netns. Policy changes apply to new
// connections; established ones (and UDP flows, which conntrack keeps for up to two minutes)
// stay allowed. Tests flush between steps so that a probe that happens to reuse a source port
// measures the new policy rather than an older flow.
func (s *Sim) FlushConntrack() error {
	out, err := exec.Command("ip", "netns", "exec", s.Bed.NodeNetNSName(), "conntrack", "-F").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "0 flow entries") {
		return fmt.Errorf("conntrack -F: %v: %s", err, out)
	}
	return nil
}

// ForwardFromNode makes addr (host:port on loopback) inside the node netns reach the same
// address in the test's own network namespace, so an agent in the node netns can talk to a
// kube-apiserver the test runs on loopback. It stops when the Sim closes.
func (s *Sim) ForwardFromNode(addr string) error {
	var ln net.Listener
	if err := s.Bed.InNode(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return fmt.Errorf("listening on %s in the node netns: %w", addr, err)
	}
	s.closers = append(s.closers, ln)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { n, _ := io.Copy(out, in); s.forwardedUp.Add(n); done <- struct{}{} }()
				go func() { io.Copy(countingWriter{in, &s.forwardedDown}, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return nil
}

// ForwardedBytes returns how many bytes ForwardFromNode carried from the server to the node
// (counted as they are written: what the agent received) and from the node to the server (counted
// once each connection closes), TLS and all.
func (s *Sim) ForwardedBytes() (down, up int64) { return s.forwardedDown.Load(), s.forwardedUp.Load() }

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// Nft runs nft inside the node netns.
func (s *Sim) Nft(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", s.Bed.NodeNetNSName(), "nft"}, args...)...).CombinedOutput()
	return string(out), err
}
