// Package kubeproxy runs a real kube-proxy (built by hack/kube-binaries.sh) inside the network
// namespace of a testbed node, against a kubetest.Server, so that tests send real packets
// through Services the way a cluster does.
//
// Nothing outside the node netns is touched. kube-proxy is run with
//   - --conntrack-max-per-core=0 and every conntrack timeout at 0 ("leave as-is"): it writes no
//     nf_conntrack sysctl and never the global nf_conntrack hashsize module parameter;
//   - --healthz-bind-address and --metrics-bind-address on 127.0.0.1 of the node netns, and
//     --bind-address-hard-fail, so a port it cannot bind stops it instead of going unnoticed;
//   - --nodeport-addresses=primary and --iptables-localhost-nodeports=false: NodePorts on the
//     node's InternalIPs only, and no route_localnet (a per-netns sysctl, but there is no need);
//   - --oom-score-adj=0: its own oom_score_adj stays as the test's (default -999);
//   - a PATH whose first directory holds a modprobe that loads nothing (it answers as if
//     modprobe had, for modules already loaded, and fails for others: kube-proxy runs
//     `modprobe ip_vs` when it cleans up after the ipvs mode, and loading a module would change
//     the host), and iptables/ip6tables(-save/-restore) of the chosen variant (nft or legacy).
//
// kube-proxy starts inside the node netns through `ip netns exec`, from one OS thread kept for
// the life of the test binary so that the parent-death signal (SIGKILL) fires only when the
// test binary dies. Its API server connection goes through a testbed.Forwarder: 127.0.0.1:<port>
// (a free port) in the node netns relays to the kube-apiserver on the test's loopback.
//
// Syncs are never guessed from time: WaitSynced reads kube-proxy's metrics (the last sync after
// a given moment, no pending changes), and WaitProgrammed compares what the kernel of the node
// netns holds (nft's kube-proxy tables, or iptables-save's nat table) with the Services and
// EndpointSlices the API server holds at the moment of the call.
package kubeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// Mode is kube-proxy's --proxy-mode.
type Mode string

const (
	NFTables Mode = "nftables"
	IPTables Mode = "iptables"
	// IPVS needs the ip_vs kernel module; Start refuses it (ErrUnsupported) unless the module
	// is already loaded, as loading it would change the host.
	IPVS Mode = "ipvs"
)

// ErrUnsupported is returned by Start for a mode that cannot run here without changing the host.
var ErrUnsupported = errors.New("kubeproxy: mode unsupported here")

const (
	// HealthzAddr and MetricsAddr are where kube-proxy serves, inside the node netns.
	HealthzAddr = "127.0.0.1:10256"
	MetricsAddr = "127.0.0.1:10249"

	stopTimeout = 10 * time.Second
)

// Host is the node whose network namespace kube-proxy runs in: a *testbed.Node, or a node of
// a minicluster. Its netns must be named (under /var/run/netns), for `ip netns exec`.
type Host interface {
	String() string
	NetNSPath() string
	InNetNSGo(fn func() error) error
	Forward(listen, target string) (*testbed.Forwarder, error)
}

// Options configure a Proxy.
type Options struct {
	// Node is the node whose netns kube-proxy runs in.
	Node Host
	// NodeName is the Node object's name (--hostname-override); default Node's String().
	NodeName string
	// Server is the API server; kube-proxy reaches it through a forwarder in the node netns.
	Server *kubetest.Server
	// Mode is the proxy mode; default NFTables.
	Mode Mode
	// ClusterCIDRs are the pod CIDRs of the cluster (--cluster-cidr), at most one per family.
	ClusterCIDRs []netip.Prefix
	// IPTablesVariant is "nft" (default) or "legacy": the iptables binaries kube-proxy finds.
	IPTablesVariant string
	// BinDir holds kube-proxy; default as kubetest finds its binaries ($KUBE_BIN_DIR).
	BinDir string
	// ExtraArgs are appended to the command line (later flags win).
	ExtraArgs []string
}

// Proxy is a kube-proxy process (running or not) of one node. Its methods are safe for
// concurrent use.
type Proxy struct {
	opts   Options
	bin    string
	dir    string
	server *kubetest.Server
	fwd    *testbed.Forwarder
	args   []string
	env    []string
	logs   *kubetest.LogBuffer

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	starts int
}

// New prepares a kube-proxy for opts.Node without starting it: the kubeconfig, the forwarder
// to the API server and the PATH shims. It skips the test (fails it under $CI) when the binary
// is missing. t.Cleanup stops the process and the forwarder, and logs kube-proxy's output
// when the test failed.
func New(t kubetest.TB, opts Options) *Proxy {
	t.Helper()
	if opts.Node == nil || opts.Server == nil {
		t.Fatal("kubeproxy: Options.Node and Options.Server are required")
	}
	if opts.NodeName == "" {
		opts.NodeName = opts.Node.String()
	}
	if opts.Mode == "" {
		opts.Mode = NFTables
	}
	if opts.IPTablesVariant == "" {
		opts.IPTablesVariant = "nft"
	}
	var bin string
	if opts.BinDir != "" {
		bin = filepath.Join(opts.BinDir, "kube-proxy")
	} else {
		bin = kubetest.Binary(t, "kube-proxy")
	}
	p := &Proxy{opts: opts, bin: bin, server: opts.Server, dir: t.TempDir(), logs: kubetest.NewLogBuffer("kube-proxy " + opts.NodeName)}
	t.Cleanup(func() {
		p.Kill()
		if p.fwd != nil {
			p.fwd.Close()
		}
		if t.Failed() {
			t.Logf("kubeproxy: kube-proxy of node %s (%s mode) log:\n%s", opts.NodeName, opts.Mode, p.Logs())
		}
	})
	var err error
	// A port of its own in the node netns (an agent there may forward the API server's port):
	// the serving certificate names 127.0.0.1, whatever the port.
	p.fwd, err = opts.Node.Forward("127.0.0.1:0", strings.TrimPrefix(opts.Server.URL, "https://"))
	if err != nil {
		t.Fatalf("kubeproxy: %v", err)
	}
	kubeconfig := filepath.Join(p.dir, "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: "https://" + p.fwd.Addr().String(), CertificateAuthorityData: opts.Server.CACert}
	cfg.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{Token: opts.Server.AdminToken}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	cfg.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatalf("kubeproxy: writing kubeconfig: %v", err)
	}
	shims := filepath.Join(p.dir, "bin")
	if err := writeShims(shims, opts.IPTablesVariant); err != nil {
		t.Fatalf("kubeproxy: %v", err)
	}
	var cidrs []string
	for _, c := range opts.ClusterCIDRs {
		cidrs = append(cidrs, c.Masked().String())
	}
	p.args = []string{
		"netns", "exec", filepath.Base(opts.Node.NetNSPath()), bin,
		"--kubeconfig=" + kubeconfig,
		"--hostname-override=" + opts.NodeName,
		"--proxy-mode=" + string(opts.Mode),
		"--cluster-cidr=" + strings.Join(cidrs, ","),
		"--detect-local-mode=ClusterCIDR",
		// Nothing global: no conntrack table size (the hashsize module parameter is the whole
		// host's), no conntrack timeouts.
		"--conntrack-max-per-core=0",
		"--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--conntrack-udp-timeout=0",
		"--conntrack-udp-timeout-stream=0",
		"--oom-score-adj=0",
		"--healthz-bind-address=" + HealthzAddr,
		"--metrics-bind-address=" + MetricsAddr,
		"--bind-address-hard-fail",
		"--nodeport-addresses=primary",
		"--iptables-localhost-nodeports=false",
		// Every change synced at once (default: at most one sync a second), in every mode.
		"--iptables-min-sync-period=0",
		"--ipvs-min-sync-period=0",
		"--profiling=false",
		"--v=2",
	}
	p.args = append(p.args, opts.ExtraArgs...)
	p.env = append(os.Environ(), "PATH="+shims+":"+os.Getenv("PATH"))
	return p
}

// Start is New followed by Proxy.Start; it fails the test when kube-proxy cannot start, and
// skips it for a mode that is unsupported here.
func Start(t kubetest.TB, opts Options) *Proxy {
	t.Helper()
	p := New(t, opts)
	if err := p.Start(); err != nil {
		if errors.Is(err, ErrUnsupported) {
			t.Skip(err.Error())
		}
		t.Fatal(err)
	}
	return p
}

// Mode is the proxy mode.
func (p *Proxy) Mode() Mode { return p.opts.Mode }

// NodeName is the name kube-proxy runs as.
func (p *Proxy) NodeName() string { return p.opts.NodeName }

// Start starts kube-proxy with the Proxy's configuration. It does not wait for it to sync
// (see WaitSynced and WaitProgrammed).
func (p *Proxy) Start() error {
	if p.opts.Mode == IPVS {
		if _, err := os.Stat("/sys/module/ip_vs"); err != nil {
			return fmt.Errorf("%w: the ipvs mode needs the ip_vs kernel module, which is not loaded (loading it would change the host)", ErrUnsupported)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("kubeproxy: already running")
	}
	p.starts++
	if p.starts > 1 {
		fmt.Fprintf(p.logs, "----- kubeproxy: start #%d -----\n", p.starts)
	}
	cmd := exec.Command("ip", p.args...)
	cmd.Env = p.env
	cmd.Stdout = p.logs
	cmd.Stderr = p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	kubetest.OnSpawnThread(func() { err = cmd.Start() })
	if err != nil {
		return fmt.Errorf("kubeproxy: starting kube-proxy: %w", err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Stop sends SIGTERM and waits for kube-proxy to exit (SIGKILL after 10 s). Its rules stay in
// the kernel, as they do when a kube-proxy pod goes away.
func (p *Proxy) Stop() error { return p.stop(stopTimeout) }

// Kill kills kube-proxy with SIGKILL, as a crash would, and waits for it.
func (p *Proxy) Kill() error { return p.stop(0) }

// Restart stops kube-proxy and starts it again with the same configuration.
func (p *Proxy) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.Start()
}

func (p *Proxy) stop(timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if timeout <= 0 {
		_ = cmd.Process.Kill()
	} else {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-done:
	case <-time.After(max(timeout, time.Second)):
		_ = cmd.Process.Kill()
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd = nil
	return nil
}

// Cleanup runs `kube-proxy --cleanup` in the node netns (kube-proxy must be stopped): it removes
// the rules of every proxy mode, as an administrator does before switching modes, so that the
// next Start installs its hooks afresh, after whatever else is there.
func (p *Proxy) Cleanup(ctx context.Context) error {
	if p.Running() {
		return errors.New("kubeproxy: Cleanup while kube-proxy runs")
	}
	cmd := exec.CommandContext(ctx, "ip", append(slices.Clone(p.args), "--cleanup")...)
	cmd.Env = p.env
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(p.logs, "----- kubeproxy: --cleanup -----\n%s", out)
	if err != nil {
		return fmt.Errorf("kube-proxy --cleanup: %w\n%s", err, out)
	}
	return nil
}

// Running reports whether kube-proxy is running.
func (p *Proxy) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited returns a non-nil error when kube-proxy is not running (any more).
func (p *Proxy) exited() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("kube-proxy is not running")
	}
	select {
	case <-p.done:
		return fmt.Errorf("kube-proxy exited (%v)", p.err)
	default:
		return nil
	}
}

// Logs returns everything kube-proxy printed, over all its starts.
func (p *Proxy) Logs() string { return p.logs.String() }

// Healthz reads kube-proxy's /healthz: nil once it has synced its rules recently.
func (p *Proxy) Healthz(ctx context.Context) error {
	body, status, err := p.get(ctx, HealthzAddr, "/healthz")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("/healthz: %d %s", status, bytes.TrimSpace(body))
	}
	return nil
}

// get reads path from addr inside the node netns.
func (p *Proxy) get(ctx context.Context, addr, path string) ([]byte, int, error) {
	return testbed.HTTPGet(ctx, p.opts.Node.InNetNSGo, addr, path)
}

// writeShims writes the PATH directory kube-proxy runs with: a modprobe that loads nothing,
// and the iptables commands of the chosen variant.
func writeShims(dir, variant string) error {
	if variant != "nft" && variant != "legacy" {
		return fmt.Errorf("IPTablesVariant %q: want nft or legacy", variant)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// modprobe [-options] MODULE...: succeed when every module named is loaded already.
	modprobe := `#!/bin/sh
for m in "$@"; do
  case "$m" in -*) continue ;; esac
  m=$(echo "$m" | tr - _)
  [ -d "/sys/module/$m" ] || { echo "modprobe (kubeproxy test shim): $m is not loaded; not loading it" >&2; exit 1; }
done
exit 0
`
	if err := os.WriteFile(filepath.Join(dir, "modprobe"), []byte(modprobe), 0o755); err != nil {
		return err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-" + variant + suffix)
			if err != nil {
				return fmt.Errorf("%s-%s%s: %w", fam, variant, suffix, err)
			}
			if err := os.Symlink(target, filepath.Join(dir, fam+suffix)); err != nil {
				return err
			}
		}
	}
	return nil
}
