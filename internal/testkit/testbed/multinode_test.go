package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// clusterEP is a matrix row/column in a multi-node bed: a pod, or (pod ==
// nil) a node's own netns and node IP.
type clusterEP struct {
	name string
	node *Node
	pod  *Pod
}

func (e clusterEP) ip(fam int) netip.Addr {
	if e.pod == nil {
		return e.node.NodeIP(fam)
	}
	return e.pod.IP(fam)
}

// clusterEndpoints lists every node (local first) followed by its pods.
func clusterEndpoints(b *Bed) []clusterEP {
	var eps []clusterEP
	for _, n := range append([]*Node{b.LocalNode()}, b.Nodes()...) {
		eps = append(eps, clusterEP{name: "node:" + n.Name, node: n})
		for _, p := range n.Pods() {
			eps = append(eps, clusterEP{name: p.String() + "@" + n.Name, node: n, pod: p})
		}
	}
	return eps
}

// probeFrom runs probes whose nil Src means the given node: probes are
// grouped by that node and run concurrently.
func probeFrom(b *Bed, nodes []*Node, probes []Probe) []error {
	res := make([]error, len(probes))
	byNode := map[*Node][]int{}
	for i, n := range nodes {
		byNode[n] = append(byNode[n], i)
	}
	var wg sync.WaitGroup
	for n, idx := range byNode {
		wg.Go(func() {
			ps := make([]Probe, len(idx))
			for j, i := range idx {
				ps[j] = probes[i]
			}
			for j, err := range n.ProbeAllResults(context.Background(), ps) {
				res[idx[j]] = err
			}
		})
	}
	wg.Wait()
	return res
}

// checkCluster probes every (src, dst != src) pair of clusterEndpoints for
// every case and compares against expect; it returns the mismatch count.
func checkCluster(t *testing.T, b *Bed, cases []probeCase, expect func(c probeCase, src, dst clusterEP) bool) int {
	t.Helper()
	eps := clusterEndpoints(b)
	type key struct {
		c        probeCase
		src, dst int
	}
	var probes []Probe
	var srcNodes []*Node
	var keys []key
	for _, c := range cases {
		for si, s := range eps {
			for di, d := range eps {
				if si == di {
					continue
				}
				probes = append(probes, Probe{Src: s.pod, Dst: d.ip(c.fam), Port: c.port, Protocol: c.proto})
				srcNodes = append(srcNodes, s.node)
				keys = append(keys, key{c, si, di})
			}
		}
	}
	start := time.Now()
	errs := probeFrom(b, srcNodes, probes)
	t.Logf("%d probes between %d endpoints in %v", len(probes), len(eps), time.Since(start).Round(time.Millisecond))
	got := map[key]bool{}
	why := map[key]error{}
	for i, k := range keys {
		got[k] = errs[i] == nil
		why[k] = errs[i]
	}
	names := make([]string, len(eps))
	for i, e := range eps {
		names[i] = e.name
	}
	bad := 0
	for _, c := range cases {
		var details []string
		for si := range eps {
			for di := range eps {
				k := key{c, si, di}
				if si != di && got[k] != expect(c, eps[si], eps[di]) {
					bad++
					details = append(details, fmt.Sprintf("  %s -> %s: %v", eps[si].name, eps[di].name, why[k]))
				}
			}
		}
		if len(details) > 0 {
			t.Errorf("%s: reachability mismatch (rows: from, cols: to; !X = unexpectedly blocked, !. = unexpectedly allowed)\n%s%s", c,
				FormatMatrixDiff(names, names,
					func(r, col int) bool { return r == col || expect(c, eps[r], eps[col]) },
					func(r, col int) bool { return r == col || got[key{c, r, col}] }),
				strings.Join(details, "\n"))
		}
	}
	return bad
}

func allowAllCluster(probeCase, clusterEP, clusterEP) bool { return true }

func mustAddNode(t *testing.T, b *Bed, name string, pods ...string) *Node {
	t.Helper()
	n, err := b.AddNode(name)
	if err != nil {
		t.Fatalf("AddNode(%s): %v", name, err)
	}
	for _, p := range pods {
		ns, pn, _ := strings.Cut(p, "/")
		if _, err := n.AddPod(ns, pn); err != nil {
			t.Fatalf("%s.AddPod(%s): %v", name, p, err)
		}
	}
	return n
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestRemoteNodeReachability: pods, node IPs and underlay IPs of the local
// and a remote node reach each other over TCP, UDP and SCTP, both families,
// in both directions.
func TestRemoteNodeReachability(t *testing.T) {
	requirePrivileges(t)
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			b := newBed(t, Config{Topology: topo, IPv4: true, IPv6: true}, "x/a", "x/b")
			if ips := b.UnderlayIPs(); ips != nil {
				t.Errorf("UnderlayIPs before AddNode = %v, want nil", ips)
			}
			if _, err := os.Stat(NetNSDir + "/" + b.UnderlayNetNSName()); !os.IsNotExist(err) {
				t.Errorf("underlay netns exists before AddNode (stat: %v)", err)
			}
			n := mustAddNode(t, b, "worker-1", "y/r1", "x/r2")

			if n.PodCIDRv4 != netip.MustParsePrefix("10.244.1.0/24") || n.PodCIDRv6 != netip.MustParsePrefix("fd00:10:244:1::/64") {
				t.Errorf("node CIDRs %s %s", n.PodCIDRv4, n.PodCIDRv6)
			}
			if got, want := n.NodeIPs(), addrs("10.244.1.1", "fd00:10:244:1::1"); !slices.Equal(got, want) {
				t.Errorf("NodeIPs = %v, want %v", got, want)
			}
			if got, want := n.UnderlayIPs(), addrs("10.255.0.2", "fd00:255::2"); !slices.Equal(got, want) {
				t.Errorf("node UnderlayIPs = %v, want %v", got, want)
			}
			if got, want := b.UnderlayIPs(), addrs("10.255.0.1", "fd00:255::1"); !slices.Equal(got, want) {
				t.Errorf("local UnderlayIPs = %v, want %v", got, want)
			}
			r1 := n.Pod("y", "r1")
			if got, want := r1.IPs(), addrs("10.244.1.2", "fd00:10:244:1::2"); !slices.Equal(got, want) {
				t.Errorf("remote pod IPs = %v, want %v", got, want)
			}
			if r1.Node() != n || b.Pod("x", "a").Node() != b.LocalNode() || !b.LocalNode().IsLocal() || n.IsLocal() {
				t.Error("Pod.Node / IsLocal inconsistent")
			}
			if got := b.Nodes(); len(got) != 1 || got[0] != n || b.Node("worker-1") != n || b.Node(LocalNodeName) != b.LocalNode() {
				t.Errorf("Nodes() = %v", got)
			}
			if got := len(b.AllPods()); got != 4 || len(b.Pods()) != 2 {
				t.Errorf("AllPods: %d pods, Pods: %d", got, len(b.Pods()))
			}

			checkCluster(t, b, allCases(b), allowAllCluster)

			// Underlay addresses are reachable too, from pods of either node.
			a := b.Pod("x", "a")
			var probes []Probe
			for _, fam := range []int{4, 6} {
				probes = append(probes,
					Probe{Src: a, Dst: n.UnderlayIP(fam), Port: 80, Protocol: TCP},
					Probe{Src: r1, Dst: b.LocalNode().UnderlayIP(fam), Port: 80, Protocol: UDP},
					Probe{Src: r1, Dst: b.LocalNode().UnderlayIP(fam), Port: 81, Protocol: SCTP},
					Probe{Src: nil, Dst: n.UnderlayIP(fam), Port: 81, Protocol: TCP},
				)
			}
			for i, err := range b.ProbeAllResults(context.Background(), probes) {
				if err != nil {
					t.Errorf("%v: %v", probes[i], err)
				}
			}
		})
	}
}

func nftIn(t *testing.T, nsName, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", nsName, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f in %s: %v\n%s\nscript:\n%s", nsName, err, out, script)
	}
}

// dropRules renders forward-chain drops of src -> dst for dport, both
// families, all three protocols.
func dropRules(src, dst *Pod, dport uint16) string {
	var sb strings.Builder
	for _, fam := range []int{4, 6} {
		ip := "ip"
		if fam == 6 {
			ip = "ip6"
		}
		fmt.Fprintf(&sb, "\t\t%s saddr %s %s daddr %s meta l4proto { tcp, udp, sctp } th dport %d counter drop\n",
			ip, src.IP(fam), ip, dst.IP(fam), dport)
	}
	return sb.String()
}

// TestRemoteNodeForwardHooks proves that traffic between pods of different
// nodes crosses the forward hook of the source node (egress) and of the
// destination node (ingress), without NAT: drop rules matching pod source
// and destination addresses in either node block exactly their flows.
func TestRemoteNodeForwardHooks(t *testing.T) {
	requirePrivileges(t, "nft")
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			ports := []uint16{80, 81, 82}
			b := newBed(t, Config{Topology: topo, IPv4: true, IPv6: true, TCPPorts: ports, UDPPorts: ports, SCTPPorts: ports}, "x/a", "x/b")
			n := mustAddNode(t, b, "remote", "y/r1", "y/r2")
			a, bb := b.Pod("x", "a"), b.Pod("x", "b")
			r1, r2 := n.Pod("y", "r1"), n.Pod("y", "r2")

			type flow struct {
				src, dst *Pod
				port     uint16
			}
			localRules := []flow{{r1, a, 81}, {a, r2, 82}}    // local ingress, local egress
			remoteRules := []flow{{bb, r1, 81}, {r2, bb, 82}} // remote ingress, remote egress
			table := func(fs []flow) string {
				s := "table inet tbtest {\n\tchain forward {\n\t\ttype filter hook forward priority 0; policy accept;\n" +
					"\t\tmeta l4proto sctp ct state invalid counter drop\n"
				for _, f := range fs {
					s += dropRules(f.src, f.dst, f.port)
				}
				return s + "\t}\n}\n"
			}
			nftIn(t, b.NodeNetNSName(), table(localRules))
			nftIn(t, n.NetNSName, table(remoteRules))

			blocked := func(c probeCase, s, d clusterEP) bool {
				return slices.Contains(append(localRules, remoteRules...), flow{s.pod, d.pod, c.port}) && s.pod != nil && d.pod != nil
			}
			if checkCluster(t, b, allCases(b), func(c probeCase, s, d clusterEP) bool { return !blocked(c, s, d) }) > 0 {
				for _, nn := range []*Node{b.LocalNode(), n} {
					out, _ := nn.Exec(context.Background(), "nft", "list", "ruleset")
					t.Logf("%s ruleset:\n%s", nn.Name, out)
				}
			}
			// Removing the rules restores full reachability.
			nftIn(t, b.NodeNetNSName(), "delete table inet tbtest")
			nftIn(t, n.NetNSName, "delete table inet tbtest")
			checkCluster(t, b, allCases(b), allowAllCluster)
		})
	}
}

// TestThreeNodes adds a second extra node later (routes are updated on the
// existing nodes), then removes and re-adds nodes.
func TestThreeNodes(t *testing.T) {
	requirePrivileges(t)
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			b := newBed(t, Config{Topology: topo, IPv4: true, IPv6: true}, "x/a")
			n1 := mustAddNode(t, b, "n1", "y/b")
			cases := []probeCase{{TCP, 80, 4}, {UDP, 81, 4}, {SCTP, 80, 4}, {TCP, 81, 6}, {UDP, 80, 6}, {SCTP, 81, 6}}
			checkCluster(t, b, cases, allowAllCluster)

			n2 := mustAddNode(t, b, "n2", "z/c", "z/d")
			if n2.PodCIDRv4 != netip.MustParsePrefix("10.244.2.0/24") || n2.PodCIDRv6 != netip.MustParsePrefix("fd00:10:244:2::/64") {
				t.Errorf("n2 CIDRs %s %s", n2.PodCIDRv4, n2.PodCIDRv6)
			}
			if got, want := n2.UnderlayIPs(), addrs("10.255.0.3", "fd00:255::3"); !slices.Equal(got, want) {
				t.Errorf("n2 UnderlayIPs = %v, want %v", got, want)
			}
			checkCluster(t, b, allCases(b), allowAllCluster)

			// Removing n1 removes the routes to it from the other nodes and
			// leaves the rest connected.
			if err := b.RemoveNode(n1); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(n1.NetNSPath()); !os.IsNotExist(err) {
				t.Errorf("removed node's netns still exists (stat: %v)", err)
			}
			for _, nn := range []*Node{b.LocalNode(), n2} {
				out, err := nn.Exec(context.Background(), "ip", "route", "show", "10.244.1.0/24")
				out6, err6 := nn.Exec(context.Background(), "ip", "-6", "route", "show", "fd00:10:244:1::/64")
				if err != nil || err6 != nil || len(out)+len(out6) != 0 {
					t.Errorf("%s still routes to removed node: %q %q (%v %v)", nn.Name, out, out6, err, err6)
				}
			}
			if _, err := n1.AddPod("y", "late"); err == nil {
				t.Error("AddPod on removed node succeeded")
			}
			if err := b.RemoveNode(n1); err == nil {
				t.Error("second RemoveNode succeeded")
			}
			n3 := mustAddNode(t, b, "n3", "w/e")
			if n3.PodCIDRv4 != netip.MustParsePrefix("10.244.3.0/24") {
				t.Errorf("n3 CIDR %s", n3.PodCIDRv4)
			}
			checkCluster(t, b, cases, allowAllCluster)
		})
	}
}

// TestMultiNodeClose: Close deletes the extra nodes, their pods and the
// underlay; RemovePod works on remote pods.
func TestMultiNodeClose(t *testing.T) {
	requirePrivileges(t)
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			b, err := New(Config{Topology: topo, IPv4: true, IPv6: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			if _, err := b.AddPod("x", "a"); err != nil {
				t.Fatal(err)
			}
			n1 := mustAddNode(t, b, "n1", "y/b", "y/c")
			n2 := mustAddNode(t, b, "n2", "z/d")
			want := []string{b.NodeNetNSName(), b.UnderlayNetNSName(), n1.NetNSName, n2.NetNSName}
			for _, p := range b.AllPods() {
				want = append(want, p.NetNSName)
			}
			slices.Sort(want)
			if got := listNetNS(t, b.ID()); !slices.Equal(got, want) {
				t.Fatalf("namespaces with prefix %s:\n got %v\nwant %v", b.ID(), got, want)
			}

			// Pod names are unique across nodes.
			if _, err := n2.AddPod("x", "a"); err == nil {
				t.Error("duplicate pod on another node accepted")
			}
			// RemovePod via the node and via the bed; not via another node.
			pb, pc := n1.Pod("y", "b"), n1.Pod("y", "c")
			if err := n2.RemovePod(pb); err == nil {
				t.Error("RemovePod of another node's pod succeeded")
			}
			if err := n1.RemovePod(pb); err != nil {
				t.Fatal(err)
			}
			if err := b.RemovePod(pc); err != nil {
				t.Fatal(err)
			}
			for _, p := range []*Pod{pb, pc} {
				if _, err := os.Stat(p.NetNSPath()); !os.IsNotExist(err) {
					t.Errorf("removed pod's netns %s still exists (stat: %v)", p.NetNSPath(), err)
				}
			}
			again, err := n1.AddPod("y", "b2")
			if err != nil {
				t.Fatal(err)
			}
			if again.IPv4 != pb.IPv4 {
				t.Errorf("re-added pod got %v, want the freed %v", again.IPv4, pb.IPv4)
			}
			if !b.Probe(context.Background(), Probe{Src: b.Pod("x", "a"), Dst: again.IPv6, Port: 80, Protocol: TCP}) {
				t.Error("re-added remote pod unreachable")
			}

			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := listNetNS(t, b.ID()); len(got) != 0 {
				t.Fatalf("namespaces left after Close: %v", got)
			}
			if _, err := b.AddNode("late"); err == nil {
				t.Error("AddNode after Close succeeded")
			}
			if _, err := n1.AddPod("y", "late"); err == nil {
				t.Error("Node.AddPod after Close succeeded")
			}
			if n1.Probe(context.Background(), Probe{Src: nil, Dst: again.IPv4, Port: 80, Protocol: TCP}) {
				t.Error("probe after Close succeeded")
			}
		})
	}
}

// TestAddNodeConfig covers CIDR selection and validation and single-stack
// beds.
func TestAddNodeConfig(t *testing.T) {
	requirePrivileges(t)
	t.Run("validation", func(t *testing.T) {
		t.Parallel()
		// A /22 local CIDR covers the default CIDRs of indexes 1 to 3.
		b := newBed(t, Config{IPv4: true, IPv6: true, PodCIDRv4: netip.MustParsePrefix("10.244.0.0/22"), PodCIDRv6: netip.MustParsePrefix("fd00:10:244::/62")}, "x/a")
		for _, cfg := range []NodeConfig{
			{Name: ""},
			{Name: LocalNodeName},
			{Name: "n", PodCIDRv4: netip.MustParsePrefix("10.244.2.0/24")},    // overlaps local
			{Name: "n", PodCIDRv4: netip.MustParsePrefix("10.255.0.0/16")},    // overlaps underlay
			{Name: "n", PodCIDRv6: netip.MustParsePrefix("fd00:255::/48")},    // overlaps underlay
			{Name: "n", PodCIDRv4: netip.MustParsePrefix("fd00:99::/64")},     // wrong family
			{Name: "n", PodCIDRv6: netip.MustParsePrefix("fd00:99::/127")},    // too small
			{Name: "n", PodCIDRv4: netip.MustParsePrefix("192.0.2.0/31")},     // too small
			{Name: "n", PodCIDRv6: netip.MustParsePrefix("fd00:10:244::/48")}, // overlaps local
		} {
			if n, err := b.AddNodeWithConfig(cfg); err == nil {
				t.Errorf("AddNodeWithConfig(%+v) succeeded: %s %s", cfg, n.PodCIDRv4, n.PodCIDRv6)
			}
		}
		if got := listNetNS(t, b.ID()); len(got) != 2 {
			t.Errorf("failed AddNode left namespaces: %v", got)
		}
		n, err := b.AddNode("n")
		if err != nil {
			t.Fatal(err)
		}
		if n.PodCIDRv4 != netip.MustParsePrefix("10.244.4.0/24") || n.PodCIDRv6 != netip.MustParsePrefix("fd00:10:244:4::/64") {
			t.Errorf("default CIDRs next to a /22: %s %s", n.PodCIDRv4, n.PodCIDRv6)
		}
		if _, err := b.AddNode("n"); err == nil {
			t.Error("duplicate node name accepted")
		}
		m, err := b.AddNodeWithConfig(NodeConfig{Name: "custom", PodCIDRv4: netip.MustParsePrefix("198.51.100.0/24"), PodCIDRv6: netip.MustParsePrefix("fd00:77::/64")})
		if err != nil {
			t.Fatal(err)
		}
		p, err := m.AddPod("y", "p")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := p.IPs(), addrs("198.51.100.2", "fd00:77::2"); !slices.Equal(got, want) {
			t.Errorf("custom-CIDR pod IPs %v, want %v", got, want)
		}
		if _, err := b.AddNodeWithConfig(NodeConfig{Name: "overlap", PodCIDRv4: netip.MustParsePrefix("198.51.100.128/25")}); err == nil {
			t.Error("CIDR overlapping another extra node accepted")
		}
		a := b.Pod("x", "a")
		for i, err := range b.ProbeAllResults(context.Background(), []Probe{
			{Src: a, Dst: p.IPv4, Port: 80, Protocol: TCP}, {Src: p, Dst: a.IPv6, Port: 81, Protocol: UDP}, {Src: p, Dst: n.NodeIP(4), Port: 80, Protocol: SCTP}, {Src: p, Dst: b.NodeIP(6), Port: 80, Protocol: TCP},
		}) {
			if err != nil {
				t.Errorf("probe %d: %v", i, err)
			}
		}
	})
	for _, fc := range familyConfigs[:2] {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			b := newBed(t, Config{Topology: Bridge, IPv4: fc.ipv4, IPv6: fc.ipv6}, "x/a")
			n := mustAddNode(t, b, "n1", "y/b")
			if n.PodCIDRv4.IsValid() != fc.ipv4 || n.PodCIDRv6.IsValid() != fc.ipv6 || len(n.UnderlayIPs()) != 1 || len(b.UnderlayIPs()) != 1 {
				t.Errorf("CIDRs %s %s, underlay %v / %v", n.PodCIDRv4, n.PodCIDRv6, n.UnderlayIPs(), b.UnderlayIPs())
			}
			checkCluster(t, b, allCases(b), allowAllCluster)
		})
	}
}

// TestAddNodePartialFailure makes AddNode fail after the node is attached
// and checks that nothing of it is left: no netns, no routes to it on the
// other nodes; later AddNodes work.
func TestAddNodePartialFailure(t *testing.T) {
	requirePrivileges(t)
	b := newBed(t, Config{IPv4: true, IPv6: true}, "x/a")
	injected := errors.New("injected failure")
	fail := true
	b.testHookAttached = func(n *Node) error {
		if fail {
			return injected
		}
		return nil
	}
	if _, err := b.AddNode("bad"); !errors.Is(err, injected) {
		t.Fatalf("AddNode with failing hook: %v", err)
	}
	// The underlay (created by the failed call) stays for later nodes.
	if got, want := listNetNS(t, b.ID()), []string{b.NodeNetNSName(), b.Pod("x", "a").NetNSName, b.UnderlayNetNSName()}; !sameSet(got, want) {
		t.Errorf("namespaces after failed AddNode: %v, want %v", got, want)
	}
	fail = false
	n1 := mustAddNode(t, b, "n1", "y/b")
	fail = true
	if _, err := b.AddNode("bad2"); !errors.Is(err, injected) {
		t.Fatalf("AddNode with failing hook: %v", err)
	}
	fail = false
	// A failed AddNode does not use up an index: n1 is the first extra
	// node, and "bad2" had index 2 (10.244.2.0/24, underlay host 3).
	if n1.PodCIDRv4 != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("n1 CIDR %s", n1.PodCIDRv4)
	}
	for _, nn := range []*Node{b.LocalNode(), n1} {
		var all string
		for _, args := range [][]string{{"-4", "route"}, {"-6", "route"}, {"-4", "neigh"}, {"-6", "neigh"}} {
			out, err := nn.Exec(context.Background(), "ip", append(args, "show")...)
			if err != nil {
				t.Fatal(err)
			}
			all += string(out)
		}
		for _, gone := range []string{"10.244.2.", "fd00:10:244:2:", "10.255.0.3 ", "fd00:255::3 "} {
			if strings.Contains(all, gone) {
				t.Errorf("%s still has routes or neighbours of the failed node (%q):\n%s", nn.Name, gone, all)
			}
		}
		if other := n1.UnderlayIP(4).String() + " "; nn.IsLocal() && !strings.Contains(all, "10.244.1.0/24 via "+other) {
			t.Errorf("local node has no route to n1:\n%s", all)
		}
	}
	a, bp := b.Pod("x", "a"), n1.Pod("y", "b")
	if !b.Probe(context.Background(), Probe{Src: a, Dst: bp.IPv4, Port: 80, Protocol: TCP}) || !b.Probe(context.Background(), Probe{Src: bp, Dst: a.IPv6, Port: 81, Protocol: UDP}) {
		t.Error("pods unreachable after failed AddNodes")
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
