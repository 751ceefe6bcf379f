// Package masquerade_test proves the agent's masquerade with packets: a node with pods, an
// "Internet" namespace beyond the node's default route holding servers that report the source
// address they see, and a second node whose pod CIDR comes from its Node object.
package masquerade_test

import (
	"context"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

var (
	// Servers in the Internet namespace. The config lists nonMasqV4/V6 as non-masquerade.
	internetV4 = netip.MustParseAddr("203.0.113.10")
	internetV6 = netip.MustParseAddr("2001:db8:aaaa::10")
	nonMasqV4  = netip.MustParseAddr("198.51.100.10")
	nonMasqV6  = netip.MustParseAddr("2001:db8:bbbb::10")
	linkLocal  = netip.MustParseAddr("169.254.169.254")
)

const baseConfig = `nonMasqueradeCIDRs:
  - 198.51.100.0/24
  - 2001:db8:bbbb::/48
resyncInterval: 1s
`

type backend struct {
	name, flag, iptablesMode string
}

var backends = []backend{
	{"nftables", "nftables", ""},
	{"iptables-nft", "iptables", "nft"},
	{"iptables-legacy", "iptables", "legacy"},
}

// scene is one simulated cluster: the local node with a pod, the Internet, and node-2 with a
// pod, all described to the agent by manifests.
type scene struct {
	t       *testing.T
	sim     *simnode.Sim
	inet    *testbed.Internet
	pod     *testbed.Pod
	remote  *testbed.Pod
	cfgPath string
	// cfgWritten is the content hash of what writeConfig wrote last.
	cfgWritten string
	localPod   *corev1.Pod
	nodes      map[string]*corev1.Node
	remoteCR   []string
}

func newScene(t *testing.T) *scene {
	t.Helper()
	kerneltest.RequireAgent(t, simnode.AgentBinary)
	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{IPv4: true, IPv6: true}})
	if err != nil {
		t.Fatal(err)
	}
	s := &scene{t: t, sim: sim, nodes: map[string]*corev1.Node{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", lastLines(sim.Log(), 80))
			out, _ := exec.Command("ip", "netns", "exec", sim.Bed.NodeNetNSName(), "sh", "-c",
				"nft list ruleset; iptables-nft-save -t nat; iptables-legacy-save -t nat; ip6tables-nft-save -t nat; ipset list").CombinedOutput()
			t.Logf("kernel:\n%s", lastLines(string(out), 120))
		}
		if s.inet != nil {
			s.inet.Close()
		}
		if err := sim.Close(); err != nil {
			t.Errorf("closing test bed: %v", err)
		}
	})
	if s.inet, err = sim.Bed.AddInternet(internetV4, internetV6, nonMasqV4, nonMasqV6, linkLocal); err != nil {
		t.Fatal(err)
	}
	obj, tp, err := sim.AddPod("default", "client", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.pod, s.localPod = tp, obj
	n2, err := sim.Bed.AddNode("node-2")
	if err != nil {
		t.Fatal(err)
	}
	if s.remote, err = n2.AddPod("default", "server"); err != nil {
		t.Fatal(err)
	}
	srv, err := s.remote.StartWhoAmI(s.inet.Port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	cfg := sim.Bed.Config()
	s.nodes[sim.NodeName] = nodeObject(sim.NodeName, cfg.PodCIDRv4.String(), cfg.PodCIDRv6.String())
	s.remoteCR = []string{n2.PodCIDRv4.String(), n2.PodCIDRv6.String()}
	s.nodes["node-2"] = nodeObject("node-2", s.remoteCR...)
	s.cfgPath = filepath.Join(t.TempDir(), "masq", "config")
	if err := os.MkdirAll(filepath.Dir(s.cfgPath), 0o755); err != nil {
		t.Fatal(err)
	}
	s.writeConfig(baseConfig)
	s.writeState()
	return s
}

func nodeObject(name string, cidrs ...string) *corev1.Node {
	return &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
}

func (s *scene) writeState() {
	s.t.Helper()
	objs := []runtime.Object{simnode.Namespace("default", nil), s.localPod}
	for _, name := range []string{s.sim.NodeName, "node-2"} {
		if n := s.nodes[name]; n != nil {
			objs = append(objs, n)
		}
	}
	if err := s.sim.SetState(objs...); err != nil {
		s.t.Fatal(err)
	}
}

// writeConfig replaces the config file the way a ConfigMap update does: a new file renamed
// into place.
func (s *scene) writeConfig(content string) {
	s.t.Helper()
	tmp := s.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.cfgPath); err != nil {
		s.t.Fatal(err)
	}
	s.cfgWritten = statusapi.ContentHash([]byte(content))
}

// settledOn reports whether an agent's status says it has applied the given manifests and
// masquerade config content, or read that config and refused it (reporting why).
func settledOn(st statusapi.Status, files map[string]string, cfg string) bool {
	m := st.Masquerade
	if m == nil || !statusapi.Covers(st, files) || m.ConfigRead != cfg {
		return false
	}
	return m.Config == cfg || m.ConfigError != ""
}

// settle waits until the agent reports that it has applied the manifests and the config last
// written (or refused an invalid config): after that, results hold at once.
func (s *scene) settle() {
	s.t.Helper()
	if err := s.sim.WaitStatus(15*time.Second, "the manifests and masquerade config written", func(st statusapi.Status) bool {
		return st.Ready && settledOn(st, s.sim.Written(), s.cfgWritten)
	}); err != nil {
		s.t.Fatal(err)
	}
}

// masqRepairs reads how many times the agent restored masquerade rules someone else changed.
func (s *scene) masqRepairs() uint64 {
	s.t.Helper()
	st, err := s.sim.Status()
	if err != nil || st.Masquerade == nil {
		s.t.Fatalf("agent status: %+v, %v", st, err)
	}
	return st.Masquerade.Repairs
}

// seen returns the source address a whoami server at dst sees for a new connection from the
// client pod.
func (s *scene) seen(dst netip.Addr) (netip.Addr, error) {
	return s.pod.SourceSeenBy(context.Background(), netip.AddrPortFrom(dst, s.inet.Port))
}

// expect waits for the agent to have applied what was written last, then checks the source
// a new connection to dst is seen from.
func (s *scene) expect(step string, dst, want netip.Addr) {
	s.t.Helper()
	s.settle()
	s.expectNow(step, dst, want)
}

// expectNow checks a result that must already hold, and still hold: no waiting for a change.
func (s *scene) expectNow(step string, dst, want netip.Addr) {
	s.t.Helper()
	for range 3 {
		got, err := s.seen(dst)
		if err != nil || got != want {
			s.t.Fatalf("%s: connection to %s seen from %v (err %v), want %s", step, dst, got, err, want)
		}
	}
}

// repaired waits (15 s at most) for new connections to dst to be seen from want again, then
// checks that it holds.
func (s *scene) repaired(step string, dst, want netip.Addr) {
	s.t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got, err := s.seen(dst); err == nil && got == want {
			break
		}
	}
	s.expectNow(step, dst, want)
}

func (s *scene) podIP(fam int) netip.Addr { return s.pod.IP(fam) }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// requireLogged checks that the agent's log comes to hold every one of want.
func requireLogged(t *testing.T, sim *simnode.Sim, what string, want ...string) {
	t.Helper()
	if missing := sim.WaitLogged(10*time.Second, want...); missing != "" {
		t.Fatalf("agent never logged %s (%q):\n%s", what, missing, lastLines(sim.Log(), 20))
	}
}

// TestMasquerade runs every masquerade behaviour on each backend, with packets.
func TestMasquerade(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			// Sequential: the iptables variant is chosen through the environment.
			t.Setenv("NETWARDEN_IPTABLES_MODE", be.iptablesMode)
			testMasquerade(t, be)
		})
	}
}

func testMasquerade(t *testing.T, be backend) {
	s := newScene(t)
	sim := s.sim
	nodeV4, nodeV6 := s.inet.NodeIPs[0], s.inet.NodeIPs[1]
	if err := sim.StartAgent("--backend", be.flag, "--network-policy=false", "--masq-config", s.cfgPath); err != nil {
		t.Fatal(err)
	}
	s.settle()
	pid := sim.AgentPID()

	// Out of the cluster: the node's address. To a listed CIDR and to a pod on another node
	// (whose range only its Node object names): the pod's own.
	s.expectNow("pod to the Internet", internetV4, nodeV4)
	s.expectNow("pod to the Internet over IPv6", internetV6, nodeV6)
	s.expectNow("pod to a non-masquerade CIDR", nonMasqV4, s.podIP(4))
	s.expectNow("pod to a non-masquerade CIDR over IPv6", nonMasqV6, s.podIP(6))
	s.expectNow("pod to a pod on node-2", s.remote.IP(4), s.podIP(4))
	s.expectNow("pod to a pod on node-2 over IPv6", s.remote.IP(6), s.podIP(6))
	s.expectNow("pod to link-local (masqLinkLocal false)", linkLocal, s.podIP(4))

	// A live config edit flips the results without a restart.
	s.writeConfig("nonMasqueradeCIDRs: [2001:db8:bbbb::/48]\nmasqLinkLocal: true\nresyncInterval: 1s\n")
	s.expect("198.51.100.0/24 removed from the config", nonMasqV4, nodeV4)
	s.expectNow("link-local with masqLinkLocal true", linkLocal, nodeV4)
	s.expectNow("IPv6 non-masquerade CIDR still listed", nonMasqV6, s.podIP(6))

	// An invalid config keeps the previous behaviour, and the error names field and value.
	s.writeConfig("nonMasqueradeCIDRs: [198.51.100.1/24]\nmasqLinkLocal: false\n")
	s.settle()
	requireLogged(t, sim, "the invalid config error", "invalid masquerade config", "nonMasqueradeCIDRs[0]", `198.51.100.1/24`, "not network-aligned")
	s.expectNow("after an invalid config, link-local", linkLocal, nodeV4)
	s.expectNow("after an invalid config, the removed CIDR", nonMasqV4, nodeV4)
	s.writeConfig(baseConfig)
	s.expect("config fixed", nonMasqV4, s.podIP(4))
	s.expectNow("config fixed, link-local", linkLocal, s.podIP(4))

	// Node podCIDRs follow Node delete and add.
	delete(s.nodes, "node-2")
	s.writeState()
	s.expect("node-2 deleted: its pods are outside the cluster", s.remote.IP(4), sim.Bed.LocalNode().UnderlayIP(4))
	s.expect("node-2 deleted, IPv6", s.remote.IP(6), sim.Bed.LocalNode().UnderlayIP(6))
	s.nodes["node-2"] = nodeObject("node-2", s.remoteCR...)
	s.writeState()
	s.expect("node-2 back", s.remote.IP(4), s.podIP(4))
	s.expect("node-2 back, IPv6", s.remote.IP(6), s.podIP(6))

	// Source matching: only this node's podCIDRs are masqueraded. A Node update that moves
	// them elsewhere leaves the pod's address alone.
	s.nodes[sim.NodeName] = nodeObject(sim.NodeName, "10.99.0.0/24", "fd00:99::/64")
	s.writeState()
	s.expect("pod outside the local podCIDRs", internetV4, s.podIP(4))
	s.expect("pod outside the local podCIDRs, IPv6", internetV6, s.podIP(6))
	cfg := sim.Bed.Config()
	s.nodes[sim.NodeName] = nodeObject(sim.NodeName, cfg.PodCIDRv4.String(), cfg.PodCIDRv6.String())
	s.writeState()
	s.expect("local podCIDRs restored", internetV4, nodeV4)

	// Someone removes our rules: the next resync (1 s) restores them.
	repairs := s.masqRepairs()
	breakRules(t, sim, be)
	if err := sim.WaitStatus(15*time.Second, "the repair", func(st statusapi.Status) bool {
		return st.Masquerade != nil && st.Masquerade.Repairs > repairs
	}); err != nil {
		t.Fatal(err)
	}
	// The break is one command per family: the agent may repair after the first, then again
	// after the second, as the kernel reports each; what must hold is that both end repaired.
	s.repaired("rules removed by someone else, then repaired", internetV4, nodeV4)
	s.repaired("repaired, IPv6", internetV6, nodeV6)
	requireLogged(t, sim, "the repair", "restoring masquerade rules")
	if got := sim.AgentPID(); got != pid {
		t.Fatalf("the agent restarted (pid %d, then %d)", pid, got)
	}

	// Stopped, the agent leaves the rules; cleanup removes them all.
	if err := sim.StopAgent(); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	s.expectNow("agent stopped, rules stay", internetV4, nodeV4)
	if out, err := sim.RunAgent(context.Background(), "cleanup"); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	s.expectNow("after cleanup nothing is masqueraded", internetV4, s.podIP(4))
	s.expectNow("after cleanup nothing is masqueraded, IPv6", internetV6, s.podIP(6))
	if left := leftovers(t, sim); left != "" {
		t.Fatalf("cleanup left:\n%s", left)
	}
}

func nodeExec(t *testing.T, sim *simnode.Sim, cmd string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", sim.Bed.NodeNetNSName(), "sh", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	return string(out)
}

// breakRules removes the masquerade rules as an operator might: the nftables table deleted, or
// the iptables chain flushed and its jump deleted.
func breakRules(t *testing.T, sim *simnode.Sim, be backend) {
	t.Helper()
	switch be.flag {
	case "nftables":
		nodeExec(t, sim, "nft delete table inet netwarden-masq")
	default:
		for _, tool := range []string{"iptables-" + be.iptablesMode, "ip6tables-" + be.iptablesMode} {
			nodeExec(t, sim, tool+` -t nat -D POSTROUTING -m comment --comment "netwarden masquerade" -m addrtype ! --dst-type LOCAL -j NETWARDEN-MASQ && `+tool+" -t nat -F NETWARDEN-MASQ")
		}
	}
	// Established flows keep their translation; the check above uses new connections.
}

func leftovers(t *testing.T, sim *simnode.Sim) string {
	t.Helper()
	var left []string
	out := nodeExec(t, sim, "nft list tables; iptables-nft-save -t nat; ip6tables-nft-save -t nat; iptables-legacy-save -t nat; ip6tables-legacy-save -t nat; ipset list -n")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "netwarden") || strings.Contains(line, "NETWARDEN") || strings.Contains(line, "nwmasq") {
			left = append(left, line)
		}
	}
	return strings.Join(left, "\n")
}

// TestMasqueradeCommands covers render, bad flags and files, and turning the feature off.
func TestMasqueradeCommands(t *testing.T) {
	s := newScene(t)
	sim := s.sim
	ctx := context.Background()
	nodeArgs := []string{"--manifests", sim.Dir, "--node-name", sim.NodeName, "--network-policy=false", "--masq-config", s.cfgPath}

	out, err := sim.RunAgent(ctx, append([]string{"render"}, nodeArgs...)...)
	if err != nil {
		t.Fatalf("render: %v\n%s", err, out)
	}
	for _, want := range []string{"add table inet netwarden-masq", "masquerade fully-random",
		"masq-src-v4 { 10.244.0.0/24 }", "nomasq-dst-v4 { 10.244.0.0/24 }", "nomasq-dst-v4 { " + s.remoteCR[0] + " }",
		"198.51.100.0/24", "169.254.0.0/16", "fe80::/10"} {
		if !strings.Contains(out, want) {
			t.Errorf("nftables render lacks %q:\n%s", want, out)
		}
	}
	out, err = sim.RunAgent(ctx, append([]string{"render", "--backend", "iptables", "--random-fully=false"}, nodeArgs...)...)
	if err != nil {
		t.Fatalf("render --backend iptables: %v\n%s", err, out)
	}
	for _, want := range []string{":NETWARDEN-MASQ - [0:0]", "-A NETWARDEN-MASQ -j MASQUERADE\n", "add nwmasq-src-v4-tmp 10.244.0.0/24", "-j NETWARDEN-MASQ"} {
		if !strings.Contains(out, want) {
			t.Errorf("iptables render lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "random-fully") {
		t.Errorf("--random-fully=false rendered random-fully:\n%s", out)
	}

	// Bad input names what is wrong and where, and applies nothing.
	s.writeConfig("nonMasqueradeCIDRs: [198.51.100.0/24]\nresyncInterval: 60\n")
	out, err = sim.RunAgent(ctx, append([]string{"render"}, nodeArgs...)...)
	if err == nil || !strings.Contains(out, s.cfgPath) || !strings.Contains(out, "resyncInterval") {
		t.Errorf("render with an invalid config: err %v, output:\n%s", err, out)
	}
	s.writeConfig(baseConfig)
	out, err = sim.RunAgent(ctx, "agent", "--once", "--manifests", sim.Dir, "--no-masquerade-cidr", "10.1.2.3/16")
	if err == nil || !strings.Contains(out, "--no-masquerade-cidr") || !strings.Contains(out, "not network-aligned") {
		t.Errorf("agent with a misaligned --no-masquerade-cidr: err %v, output:\n%s", err, out)
	}
	if strings.Contains(nodeExec(t, sim, "nft list tables"), "netwarden-masq") {
		t.Error("a rejected flag still installed rules")
	}

	// --once applies and verifies; --masquerade=false removes what an earlier run left.
	if out, err := sim.RunAgent(ctx, "agent", "--once", "--manifests", sim.Dir, "--node-name", sim.NodeName, "--network-policy=false", "--masq-config", s.cfgPath); err != nil {
		t.Fatalf("agent --once: %v\n%s", err, out)
	}
	s.expectNow("after agent --once", internetV4, s.inet.NodeIPs[0])
	if out, err := sim.RunAgent(ctx, "agent", "--once", "--manifests", sim.Dir, "--node-name", sim.NodeName, "--network-policy=false", "--masquerade=false"); err != nil {
		t.Fatalf("agent --once --masquerade=false: %v\n%s", err, out)
	}
	s.expectNow("after --masquerade=false", internetV4, s.podIP(4))
	if left := leftovers(t, sim); left != "" {
		t.Fatalf("--masquerade=false left:\n%s", left)
	}
}

// TestMasqueradeAcrossNodes runs an agent on each of three nodes, as the DaemonSet does: pod
// traffic between nodes keeps the pods' addresses in both directions, traffic to the Internet is
// masqueraded, and a node added later is picked up by every agent once its Node object appears.
func TestMasqueradeAcrossNodes(t *testing.T) {
	s := newScene(t)
	sim := s.sim
	node2 := sim.Bed.Node("node-2")
	node2Sock := filepath.Join(t.TempDir(), "agent.sock")
	startOn := func(n *testbed.Node, sock string) {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", n.NetNSName, os.Getenv("NETWARDEN_BIN"), "agent", "--manifests", sim.Dir,
			"--node-name", n.Name, "--health-addr", "unix:"+sock, "--network-policy=false", "--masq-config", s.cfgPath)
		var log strings.Builder
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() {
				t.Logf("agent on %s:\n%s", n.Name, lastLines(log.String(), 30))
			}
		})
	}
	startOn(node2, node2Sock)
	if err := sim.StartAgent("--network-policy=false", "--masq-config", s.cfgPath); err != nil {
		t.Fatal(err)
	}
	s.settle()
	// settleNode2 waits for node-2's agent as settle does for node-1's.
	settleNode2 := func() {
		t.Helper()
		files := sim.Written()
		var last statusapi.Status
		var lastErr error
		deadline := time.Now().Add(15 * time.Second)
		for {
			last, lastErr = statusapi.UnixClient(node2Sock).Read(statusapi.Query{Files: slices.Collect(maps.Keys(files))})
			if lastErr == nil && last.Ready && settledOn(last, files, s.cfgWritten) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("node-2's agent did not apply the state written: %+v, %v", last, lastErr)
			}
			time.Sleep(5 * time.Millisecond) // poll interval
		}
	}
	settleNode2()

	// node-2's pod connects back to a whoami server in the node-1 pod.
	back, err := s.pod.StartWhoAmI(s.inet.Port)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	fromRemote := func(step string, dst, want netip.Addr) {
		t.Helper()
		settleNode2()
		if got, err := s.remote.SourceSeenBy(context.Background(), netip.AddrPortFrom(dst, s.inet.Port)); err != nil || got != want {
			t.Fatalf("%s: connection to %s seen from %v (err %v), want %s", step, dst, got, err, want)
		}
	}
	s.expect("node-1 pod to node-2 pod", s.remote.IP(4), s.podIP(4))
	s.expectNow("node-1 pod to node-2 pod, IPv6", s.remote.IP(6), s.podIP(6))
	fromRemote("node-2 pod to node-1 pod", s.podIP(4), s.remote.IP(4))
	fromRemote("node-2 pod to node-1 pod, IPv6", s.podIP(6), s.remote.IP(6))
	s.expectNow("node-1 pod to the Internet", internetV4, s.inet.NodeIPs[0])

	// node-3 joins: until its Node object exists its pods are outside the cluster (the config
	// does not list 10.0.0.0/8), then both agents keep their addresses.
	node3, err := sim.Bed.AddNode("node-3")
	if err != nil {
		t.Fatal(err)
	}
	pod3, err := node3.AddPod("default", "late")
	if err != nil {
		t.Fatal(err)
	}
	srv3, err := pod3.StartWhoAmI(s.inet.Port)
	if err != nil {
		t.Fatal(err)
	}
	defer srv3.Close()
	s.expect("node-3 without a Node object", pod3.IP(4), sim.Bed.LocalNode().UnderlayIP(4))
	fromRemote("node-2 pod to node-3 without a Node object", pod3.IP(4), node2.UnderlayIP(4))
	s.nodes["node-3"] = nodeObject("node-3", node3.PodCIDRv4.String(), node3.PodCIDRv6.String())
	objs := []runtime.Object{simnode.Namespace("default", nil), s.localPod}
	for _, name := range []string{sim.NodeName, "node-2", "node-3"} {
		objs = append(objs, s.nodes[name])
	}
	if err := sim.SetState(objs...); err != nil {
		t.Fatal(err)
	}
	s.expect("node-3 known to node-1's agent", pod3.IP(4), s.podIP(4))
	s.expect("node-3 known to node-1's agent, IPv6", pod3.IP(6), s.podIP(6))
	fromRemote("node-3 known to node-2's agent", pod3.IP(4), s.remote.IP(4))
}
