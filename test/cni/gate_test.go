package cni_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
)

const (
	gateNodeName = "node-1"
	gateSubnet   = "10.89.0.0/24"
)

// gateNode is a node netns running the real agent with --gate-socket, and a conflist of the
// upstream bridge and host-local plugins followed by netwarden-gate.
type gateNode struct {
	*node
	dir        string // the agent's manifests directory
	sock       string // the gate socket
	statusSock string
	agent      *exec.Cmd
	agentLog   *bytes.Buffer
	logMu      sync.Mutex
}

// lockedBuffer lets the agent write its log while a failing test reads it.
type lockedBuffer struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (l lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func newGateNode(t testing.TB, backend string) *gateNode {
	t.Helper()
	g := &gateNode{node: newBareNode(t, backend), agentLog: &bytes.Buffer{}}
	// As on a Kubernetes node, bridged pod-to-pod packets pass the IP hooks, where the agent's
	// rules judge them.
	for _, k := range []string{"net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1"} {
		sh(t, g.ns, "sysctl", "-qw", k)
	}
	dir := t.TempDir()
	g.dir = filepath.Join(dir, "manifests")
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A unix socket path is limited to 108 bytes; TempDir's may be longer.
	sockDir, err := os.MkdirTemp("", "nw-gate-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	g.sock, g.statusSock = filepath.Join(sockDir, "gate.sock"), filepath.Join(sockDir, "status.sock")
	g.cacheDir = filepath.Join(dir, "cache")
	g.cfg = libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, g.cacheDir, nil)
	g.list = g.conflist(t, filepath.Join(dir, "ipam"), map[string]any{"timeout": "5s"}, true)
	t.Cleanup(func() {
		g.stopAgent()
		if t.Failed() {
			g.logMu.Lock()
			t.Logf("agent log:\n%s", tailLines(g.agentLog.String(), 40))
			g.logMu.Unlock()
			out, _ := shErr(g.ns, "sh", "-c", "nft list ruleset; iptables-save -t mangle; ipset list")
			t.Logf("ruleset:\n%s", out)
		}
	})
	return g
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// conflist is bridge and host-local, then netwarden-gate (with extra in its config) when
// withGate is set.
func (g *gateNode) conflist(t testing.TB, ipamDir string, extra map[string]any, withGate bool) *libcni.NetworkConfigList {
	t.Helper()
	plugins := []any{map[string]any{
		"type": "bridge", "bridge": "cni0", "isGateway": true,
		"ipam": map[string]any{
			"type": "host-local", "dataDir": ipamDir,
			"ranges": []any{[]any{map[string]string{"subnet": gateSubnet}}},
			"routes": []any{map[string]string{"dst": "0.0.0.0/0"}},
		},
	}}
	if withGate {
		gc := map[string]any{"type": "netwarden-gate", "socket": g.sock}
		for k, v := range extra {
			gc[k] = v
		}
		plugins = append(plugins, gc)
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": network, "plugins": plugins})
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("conflist: %v", err)
	}
	return list
}

// setState writes the cluster state the agent reads: this node with its podCIDR, and objs.
func (g *gateNode) setState(t testing.TB, objs ...runtime.Object) {
	t.Helper()
	node := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: gateNodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{gateSubnet}}}
	data, err := simnode.Marshal(append([]runtime.Object{node}, objs...)...)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(g.dir, ".tmp-cluster.yaml")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(g.dir, "cluster.yaml")); err != nil {
		t.Fatal(err)
	}
}

func (g *gateNode) startAgent(t testing.TB) {
	t.Helper()
	bin, err := simnode.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	backend, mode, _ := strings.Cut(g.backend, "-")
	cmd := exec.Command("ip", "netns", "exec", nsName(g.ns), bin, "agent", "--node-name", gateNodeName, "--manifests", g.dir,
		"--backend", backend, "--gate-socket", g.sock, "--health-addr", "unix:"+g.statusSock)
	cmd.Env = append(os.Environ(), "NETWARDEN_IPTABLES_MODE="+mode)
	cmd.Stdout = lockedBuffer{&g.logMu, g.agentLog}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.agent = cmd
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := statusapi.UnixClient(g.statusSock).Read(statusapi.Query{})
		if err == nil && st.Ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready: %v %+v", err, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (g *gateNode) stopAgent() {
	if g.agent == nil {
		return
	}
	_ = g.agent.Process.Signal(syscall.SIGTERM)
	_ = g.agent.Wait()
	g.agent = nil
}

// gatePod is a pod netns, ADDed through the conflist by add.
type gatePod struct {
	namespace, name string
	ns              ns.NetNS
	rt              *libcni.RuntimeConf
	ip              netip.Addr
}

func (g *gateNode) newPod(t testing.TB, namespace, name, ip string) *gatePod {
	t.Helper()
	p := &gatePod{namespace: namespace, name: name, ns: newNS(t)}
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}
	if ip != "" {
		// host-local and bridge take a fixed address and MAC from CNI_ARGS, so probes can aim
		// at the pod before ADD (see staticNeigh).
		p.ip = netip.MustParseAddr(ip)
		args = append(args, [2]string{"IP", ip}, [2]string{"MAC", podMAC(p.ip)})
	}
	p.rt = &libcni.RuntimeConf{ContainerID: "ctr-" + namespace + "-" + name, NetNS: p.ns.Path(), IfName: "eth0", Args: args}
	return p
}

func (g *gateNode) add(list *libcni.NetworkConfigList, p *gatePod) error {
	var res types.Result
	err := g.inNode(func() error {
		var err error
		res, err = g.cfg.AddNetworkList(context.Background(), list, p.rt)
		return err
	})
	if err != nil {
		return err
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return err
	}
	for _, ipc := range r.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && a.Unmap().Is4() {
			p.ip = a.Unmap()
		}
	}
	return nil
}

func podMAC(ip netip.Addr) string {
	b := ip.As4()
	return fmt.Sprintf("0a:58:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
}

// staticNeigh gives from a permanent neighbour entry for to, which has a fixed MAC: a peer that
// probes a pod before it exists would otherwise wait out ARP's one-second retry after it
// appears, and its probes would fail for a reason that is not the policy's.
func staticNeigh(t testing.TB, from, to *gatePod) {
	t.Helper()
	sh(t, from.ns, "ip", "neigh", "replace", to.ip.String(), "lladdr", podMAC(to.ip), "dev", "eth0", "nud", "permanent")
}

// listen serves TCP on port 80 in the pod (on every address: it exists before the pod has one).
func listenPod(t testing.TB, p *gatePod) {
	t.Helper()
	var l net.Listener
	if err := p.ns.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp4", ":80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
}

// probe connects from the pod's netns to addr:80 and reads the greeting.
func probePod(from *gatePod, to netip.Addr, timeout time.Duration) bool {
	ok := false
	_ = from.ns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(to, 80).String(), timeout)
		if err != nil {
			return nil
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		buf := make([]byte, 2)
		n, _ := c.Read(buf)
		ok = n == 2
		return nil
	})
	return ok
}

func gatePodObject(namespace, name string, labels map[string]string) *corev1.Pod {
	// No IPs: the API has not heard of them yet when the runtime starts the pod.
	return simnode.PodObject(namespace, name, gateNodeName, labels, nil)
}

func onlyFromAllowed() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "target-only-from-allowed"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "allowed"}}}}}},
		},
	}
}

type probeResult struct {
	start time.Time
	ok    bool
}

// TestGateJudgesPodFromFirstPacket starts a target pod through bridge, host-local and
// netwarden-gate while two peers probe it continuously from before its ADD: a peer its
// policy denies never gets through, at any time, and the allowed peer gets through on every
// probe begun after ADD returned. Neither the target nor the peers have IPs in the agent's
// state: the gate told it. A pod the agent cannot find fails its ADD after the configured
// timeout and stays dropped even though no policy isolates it; CHECK, STATUS, DEL and GC
// work as the spec says.
func TestGateJudgesPodFromFirstPacket(t *testing.T) {
	requireKernel(t)
	for _, backend := range []string{"nftables", "iptables-nft"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			testGate(t, backend)
		})
	}
}

func testGate(t *testing.T, backend string) {
	g := newGateNode(t, backend)
	g.setState(t, simnode.Namespace("x", nil), onlyFromAllowed(),
		gatePodObject("x", "allowed", map[string]string{"role": "allowed"}),
		gatePodObject("x", "denied", map[string]string{"role": "denied"}),
		gatePodObject("x", "target", map[string]string{"app": "target"}))
	g.startAgent(t)

	allowed, denied := g.newPod(t, "x", "allowed", ""), g.newPod(t, "x", "denied", "")
	for _, p := range []*gatePod{allowed, denied} {
		if err := g.add(g.list, p); err != nil {
			t.Fatalf("ADD %s: %v", p.name, err)
		}
	}
	target := g.newPod(t, "x", "target", "10.89.0.200")
	listenPod(t, target)
	staticNeigh(t, allowed, target)
	staticNeigh(t, denied, target)

	var mu sync.Mutex
	results := map[string][]probeResult{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, from := range []*gatePod{allowed, denied} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ok := probePod(from, target.ip, 100*time.Millisecond)
				mu.Lock()
				results[from.name] = append(results[from.name], probeResult{start, ok})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(30 * time.Millisecond) // some probes before the pod has its interface
	if err := g.add(g.list, target); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("ADD target: %v", err)
	}
	added := time.Now()
	if os.Getenv("GATE_DEBUG") != "" {
		out, _ := shErr(g.ns, "nft", "list", "table", "inet", "netwarden-guard")
		t.Logf("after ADD:\n%s", out)
		out, _ = shErr(g.ns, "conntrack", "-L")
		t.Logf("conntrack:\n%s", out)
		out, _ = shErr(allowed.ns, "ip", "neigh")
		t.Logf("neigh:\n%s", out)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	after := 0
	for _, r := range results["allowed"] {
		if r.start.After(added) {
			after++
			if !r.ok {
				t.Errorf("allowed -> target: a probe begun %v after ADD returned failed", r.start.Sub(added))
			}
		}
	}
	if after < 3 {
		t.Errorf("allowed -> target: only %d probes after ADD returned", after)
	}
	for _, r := range results["denied"] {
		if r.ok {
			t.Errorf("denied -> target: a probe begun %v after ADD returned got through", r.start.Sub(added))
		}
	}
	if len(results["denied"]) < 3 {
		t.Errorf("denied -> target: only %d probes", len(results["denied"]))
	}
	if err := g.inNode(func() error { return g.cfg.CheckNetworkList(context.Background(), g.list, target.rt) }); err != nil {
		t.Errorf("CHECK target: %v", err)
	}

	// A pod the agent cannot find (not in its state) has no verdicts: ADD fails after the
	// timeout and its address stays dropped, though no policy selects it.
	short := g.conflist(t, filepath.Join(filepath.Dir(g.cacheDir), "ipam"), map[string]any{"timeout": "300ms"}, true)
	ghost := g.newPod(t, "x", "ghost", "10.89.0.201")
	listenPod(t, ghost)
	staticNeigh(t, allowed, ghost)
	err := g.add(short, ghost)
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("ADD of a pod the agent does not know: got %v, want a timeout error", err)
	}
	if probePod(allowed, ghost.ip, 300*time.Millisecond) {
		t.Errorf("allowed -> ghost: got through to a pod without verdicts")
	}
	if err := g.inNode(func() error { return g.cfg.CheckNetworkList(context.Background(), short, ghost.rt) }); err == nil {
		t.Errorf("CHECK ghost: succeeded for a pod without verdicts")
	}
	if err := g.inNode(func() error { return g.cfg.DelNetworkList(context.Background(), short, ghost.rt) }); err != nil {
		t.Errorf("DEL ghost: %v", err)
	}

	if err := g.inNode(func() error { return g.cfg.GetStatusNetworkList(context.Background(), g.list) }); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	// GC keeping only target: the agent forgets the peers' registrations; their addresses
	// stay known only through the state, which has none, so they are dropped again.
	if err := g.inNode(func() error {
		return g.cfg.GCNetworkList(context.Background(), g.list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{
			{ContainerID: target.rt.ContainerID, IfName: "eth0"}}})
	}); err != nil {
		t.Errorf("GC: %v", err)
	}
	if err := waitFor(5*time.Second, func() bool { return !probePod(allowed, target.ip, 100*time.Millisecond) }); err != nil {
		t.Errorf("after GC dropped allowed's registration, allowed still reaches target")
	}
	g.stopAgent()
	if err := g.inNode(func() error { return g.cfg.GetStatusNetworkList(context.Background(), g.list) }); err == nil {
		t.Errorf("STATUS with the agent stopped: succeeded")
	}
}

func waitFor(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
