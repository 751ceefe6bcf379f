package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// requirePrivileges skips (or, when $CI is set, fails) tests that need root
// and the ip/nft tools.
func requirePrivileges(t *testing.T, tools ...string) {
	t.Helper()
	var reason string
	if os.Geteuid() != 0 {
		reason = "testbed tests need root (network namespaces, veth, nftables)"
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if reason != "" {
			break
		}
		if _, err := exec.LookPath(tool); err != nil {
			reason = fmt.Sprintf("testbed tests need %q in PATH: %v", tool, err)
		}
	}
	if reason == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, refusing to skip: %s", reason)
	}
	t.Skip(reason)
}

func newBed(t *testing.T, cfg Config, pods ...string) *Bed {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	for _, p := range pods {
		ns, name, _ := strings.Cut(p, "/")
		if _, err := b.AddPod(ns, name); err != nil {
			t.Fatalf("AddPod(%s): %v", p, err)
		}
	}
	return b
}

// endpoint is a matrix row/column: a pod, or the node when pod is nil.
type endpoint struct {
	name string
	pod  *Pod
}

func endpoints(b *Bed) []endpoint {
	eps := []endpoint{{name: "node"}}
	for _, p := range b.Pods() {
		eps = append(eps, endpoint{name: p.String(), pod: p})
	}
	return eps
}

func (e endpoint) ip(b *Bed, fam int) netip.Addr {
	if e.pod == nil {
		return b.NodeIP(fam)
	}
	return e.pod.IP(fam)
}

type probeCase struct {
	proto Protocol
	port  uint16
	fam   int
}

func (c probeCase) String() string { return fmt.Sprintf("%s/%d IPv%d", c.proto, c.port, c.fam) }

func families(cfg Config) []int {
	var f []int
	if cfg.IPv4 {
		f = append(f, 4)
	}
	if cfg.IPv6 {
		f = append(f, 6)
	}
	return f
}

func allCases(b *Bed) []probeCase {
	cfg := b.Config()
	var cs []probeCase
	for _, fam := range families(cfg) {
		for _, p := range cfg.TCPPorts {
			cs = append(cs, probeCase{TCP, p, fam})
		}
		for _, p := range cfg.UDPPorts {
			cs = append(cs, probeCase{UDP, p, fam})
		}
		for _, p := range cfg.SCTPPorts {
			cs = append(cs, probeCase{SCTP, p, fam})
		}
	}
	return cs
}

// checkMatrix probes every (src, dst != src) pair for every case in parallel
// and compares against expect. It returns the number of mismatches.
func checkMatrix(t *testing.T, b *Bed, cases []probeCase, expect func(c probeCase, src, dst endpoint) bool) int {
	t.Helper()
	eps := endpoints(b)
	type key struct {
		c        probeCase
		src, dst int
	}
	var probes []Probe
	var keys []key
	for _, c := range cases {
		for si, s := range eps {
			for di, d := range eps {
				if si == di {
					continue
				}
				probes = append(probes, Probe{Src: s.pod, Dst: d.ip(b, c.fam), Port: c.port, Protocol: c.proto})
				keys = append(keys, key{c, si, di})
			}
		}
	}
	start := time.Now()
	res := b.ProbeAll(context.Background(), probes)
	t.Logf("%d probes in %v", len(probes), time.Since(start).Round(time.Millisecond))
	// A probe starved of CPU on a busy machine times out, which reads as blocked; a flow that
	// is really blocked stays blocked, so those are probed again before judging. Nothing makes
	// a blocked flow pass, so an unexpected pass is judged at once.
	for attempt := 0; attempt < 2; attempt++ {
		var again []int
		for i, k := range keys {
			if !res[i] && expect(k.c, eps[k.src], eps[k.dst]) {
				again = append(again, i)
			}
		}
		if len(again) == 0 {
			break
		}
		retry := make([]Probe, len(again))
		for j, i := range again {
			retry[j] = probes[i]
		}
		t.Logf("probing %d blocked flows again", len(again))
		for j, ok := range b.ProbeAll(context.Background(), retry) {
			res[again[j]] = ok
		}
	}
	got := map[key]bool{}
	for i, k := range keys {
		got[k] = res[i]
	}
	names := make([]string, len(eps))
	for i, e := range eps {
		names[i] = e.name
	}
	bad := 0
	for _, c := range cases {
		mismatch := false
		for si := range eps {
			for di := range eps {
				if si != di && got[key{c, si, di}] != expect(c, eps[si], eps[di]) {
					mismatch = true
					bad++
				}
			}
		}
		if mismatch {
			t.Errorf("%s: reachability mismatch (rows: from, cols: to; !X = unexpectedly blocked, !. = unexpectedly allowed)\n%s", c,
				FormatMatrixDiff(names, names,
					func(r, col int) bool { return r == col || expect(c, eps[r], eps[col]) },
					func(r, col int) bool { return r == col || got[key{c, r, col}] }))
		}
	}
	return bad
}

func allowAll(probeCase, endpoint, endpoint) bool { return true }

var threePods = []string{"x/a", "x/b", "y/c"}

var familyConfigs = []struct {
	name       string
	ipv4, ipv6 bool
}{
	{"ipv4", true, false},
	{"ipv6", false, true},
	{"dual", true, true},
}

func TestFullReachability(t *testing.T) {
	requirePrivileges(t)
	for _, topo := range []Topology{Routed, Bridge} {
		for _, fc := range familyConfigs {
			t.Run(string(topo)+"/"+fc.name, func(t *testing.T) {
				t.Parallel()
				b := newBed(t, Config{Topology: topo, IPv4: fc.ipv4, IPv6: fc.ipv6}, threePods...)
				checkMatrix(t, b, allCases(b), allowAll)
			})
		}
	}
}

func nft(t *testing.T, b *Bed, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", b.NodeNetNSName(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f in %s: %v\n%s\nscript:\n%s", b.NodeNetNSName(), err, out, script)
	}
}

// TestNetfilterHooks proves that pod->pod traffic crosses the node's forward
// hook (for Bridge: via br_netfilter) and pod->node traffic its input hook,
// and that SCTP INITs are valid for conntrack (bad checksums would make them
// ct state invalid, which the ruleset drops).
func TestNetfilterHooks(t *testing.T) {
	requirePrivileges(t, "nft")
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			b := newBed(t, Config{Topology: topo, IPv4: true, IPv6: true}, threePods...)
			a, c := b.Pod("x", "a"), b.Pod("y", "c")
			nft(t, b, fmt.Sprintf(`
table inet tbtest {
	chain forward {
		type filter hook forward priority 0; policy accept;
		meta l4proto sctp ct state invalid counter drop
		ip daddr %[1]s tcp dport 81 drop
		ip6 daddr %[2]s tcp dport 81 drop
		ip daddr %[1]s sctp dport 81 drop
		ip6 daddr %[2]s sctp dport 81 drop
	}
	chain input {
		type filter hook input priority 0; policy accept;
		ip saddr %[3]s meta l4proto { tcp, udp, sctp } th dport 81 drop
		ip6 saddr %[4]s meta l4proto { tcp, udp, sctp } th dport 81 drop
	}
}`, c.IPv4, c.IPv6, a.IPv4, a.IPv6))
			blocked := func(pc probeCase, src, dst endpoint) bool {
				if pc.port != 81 || src.pod == nil {
					return false
				}
				if dst.pod == c && (pc.proto == TCP || pc.proto == SCTP) {
					return true // forward hook
				}
				return dst.pod == nil && src.pod == a // input hook
			}
			if checkMatrix(t, b, allCases(b), func(pc probeCase, s, d endpoint) bool { return !blocked(pc, s, d) }) > 0 {
				out, _ := b.NodeExec(context.Background(), "nft", "list", "ruleset")
				t.Logf("node ruleset:\n%s", out)
			}
			// Removing the rules restores full reachability.
			nft(t, b, "delete table inet tbtest")
			checkMatrix(t, b, allCases(b), allowAll)
		})
	}
}

func listNetNS(t *testing.T, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(NetNSDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestCloseRemovesNamespaces(t *testing.T) {
	requirePrivileges(t)
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			b, err := New(Config{Topology: topo, IPv4: true, IPv6: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			for _, p := range threePods {
				ns, name, _ := strings.Cut(p, "/")
				if _, err := b.AddPod(ns, name); err != nil {
					t.Fatal(err)
				}
			}
			if got := listNetNS(t, b.ID()); len(got) != 4 {
				t.Fatalf("want 4 namespaces with prefix %s, got %v", b.ID(), got)
			}
			if _, err := os.Stat(b.NodeNetNSPath()); err != nil {
				t.Fatalf("node netns path: %v", err)
			}
			if out, err := exec.Command("ip", "netns", "exec", b.NodeNetNSName(), "true").CombinedOutput(); err != nil {
				t.Fatalf("ip netns exec %s: %v: %s", b.NodeNetNSName(), err, out)
			}

			// RemovePod deletes the pod's netns; re-adding reuses its IPs and
			// (with MACs derived from IPs) is reachable right away.
			victim := b.Pod("x", "b")
			if err := b.RemovePod(victim); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(victim.NetNSPath()); !os.IsNotExist(err) {
				t.Fatalf("removed pod's netns %s still exists (err=%v)", victim.NetNSPath(), err)
			}
			again, err := b.AddPod("x", "b2")
			if err != nil {
				t.Fatal(err)
			}
			if again.IPv4 != victim.IPv4 || again.IPv6 != victim.IPv6 {
				t.Errorf("re-added pod got %v, want the freed %v", again.IPs(), victim.IPs())
			}
			checkMatrix(t, b, []probeCase{{TCP, 80, 4}, {TCP, 80, 6}}, allowAll)

			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := listNetNS(t, b.ID()); len(got) != 0 {
				t.Fatalf("namespaces left after Close: %v", got)
			}
			if err := b.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := b.AddPod("x", "late"); err == nil {
				t.Fatal("AddPod after Close succeeded")
			}
		})
	}
}

func TestFormatMatrix(t *testing.T) {
	got := FormatMatrix([]string{"a", "bb"}, []string{"a", "bb"}, func(r, c int) bool { return r == c })
	want := "   | a  bb\n---+------\na  | .  X \nbb | X  . \n"
	if got != want {
		t.Errorf("FormatMatrix:\n%q\nwant\n%q", got, want)
	}
}

// TestProbeNegativeControls makes sure probes do not report success for
// closed ports or absent hosts, and that they respect the timeout.
func TestProbeNegativeControls(t *testing.T) {
	requirePrivileges(t)
	for _, topo := range []Topology{Routed, Bridge} {
		t.Run(string(topo), func(t *testing.T) {
			t.Parallel()
			b := newBed(t, Config{Topology: topo, IPv4: true, IPv6: true, TCPPorts: []uint16{8080}, UDPPorts: []uint16{53}, SCTPPorts: []uint16{9000}}, "x/a", "x/b")
			b.Timeout = 300 * time.Millisecond
			a, p := b.Pod("x", "a"), b.Pod("x", "b")
			unused4 := netip.MustParseAddr("10.244.0.200")
			unused6 := netip.MustParseAddr("fd00:10:244::200")
			cases := []struct {
				probe Probe
				want  bool
			}{
				{Probe{Src: a, Dst: p.IPv4, Port: 8080, Protocol: TCP}, true},
				{Probe{Src: a, Dst: p.IPv6, Port: 53, Protocol: UDP}, true},
				{Probe{Src: a, Dst: p.IPv4, Port: 9000, Protocol: SCTP}, true},
				{Probe{Src: nil, Dst: p.IPv6, Port: 9000, Protocol: SCTP}, true},
				{Probe{Src: a, Dst: b.NodeIP(6), Port: 8080, Protocol: TCP}, true},
				{Probe{Src: a, Dst: a.IPv4, Port: 8080, Protocol: TCP}, true}, // pod to itself
				{Probe{Src: a, Dst: a.IPv6, Port: 9000, Protocol: SCTP}, true},
				{Probe{Src: a, Dst: p.IPv4, Port: 80, Protocol: TCP}, false}, // no server: RST
				{Probe{Src: a, Dst: p.IPv6, Port: 80, Protocol: TCP}, false},
				{Probe{Src: a, Dst: p.IPv4, Port: 54, Protocol: UDP}, false}, // no server: ICMP port unreachable
				{Probe{Src: nil, Dst: p.IPv6, Port: 54, Protocol: UDP}, false},
				{Probe{Src: a, Dst: p.IPv4, Port: 9001, Protocol: SCTP}, false}, // not an SCTP port of the bed
				{Probe{Src: a, Dst: b.NodeIP(4), Port: 9001, Protocol: SCTP}, false},
				{Probe{Src: a, Dst: p.IPv4, Port: 8080, Protocol: SCTP}, false},
				{Probe{Src: a, Dst: unused4, Port: 8080, Protocol: TCP}, false}, // nobody there
				{Probe{Src: a, Dst: unused6, Port: 53, Protocol: UDP}, false},
				{Probe{Src: a, Dst: unused4, Port: 9000, Protocol: SCTP}, false},
				{Probe{Src: nil, Dst: unused6, Port: 9000, Protocol: SCTP}, false},
				{Probe{Src: a, Dst: p.IPv4, Port: 8080, Protocol: "ICMP"}, false},
			}
			probes := make([]Probe, len(cases))
			for i, c := range cases {
				probes[i] = c.probe
			}
			start := time.Now()
			errs := b.ProbeAllResults(context.Background(), probes)
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("ProbeAll took %v with a 300ms timeout", el)
			}
			for i, c := range cases {
				if got := errs[i] == nil; got != c.want {
					_, err := b.ProbeResult(context.Background(), c.probe)
					t.Errorf("%v: got %v (%v), want %v (again: %v)", c.probe, got, errs[i], c.want, err)
				}
			}

			// A cancelled context fails fast.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if b.Probe(ctx, Probe{Src: a, Dst: p.IPv4, Port: 8080, Protocol: TCP}) {
				t.Error("probe with cancelled context succeeded")
			}
		})
	}
}

// TestInNode checks that InNode switches into the node netns and back.
func TestInNode(t *testing.T) {
	requirePrivileges(t)
	b := newBed(t, Config{IPv4: true})
	var want, inside, after os.FileInfo
	var err error
	if want, err = os.Stat(b.NodeNetNSPath()); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.InNode(func() error {
		inside, err = os.Stat("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if after, err = os.Stat("/proc/thread-self/ns/net"); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(want, inside) {
		t.Error("InNode did not run fn in the node netns")
	}
	if !os.SameFile(before, after) {
		t.Error("InNode did not restore the original netns")
	}
	if out, err := b.NodeExec(context.Background(), "ip", "-o", "addr", "show", "dev", "lo"); err != nil || !strings.Contains(string(out), "10.244.0.1/32") {
		t.Errorf("NodeExec ip addr: %v\n%s", err, out)
	}
}

// TestNewPartialFailureCleansUp makes New fail after the node netns exists
// (duplicate port => EADDRINUSE when starting the node's servers) and checks
// that the namespace is gone.
func TestNewPartialFailureCleansUp(t *testing.T) {
	requirePrivileges(t)
	b, err := New(Config{IPv4: true, TCPPorts: []uint16{80, 80}})
	if err == nil {
		b.Close()
		t.Fatal("New with duplicate TCP ports succeeded")
	}
	t.Logf("New: %v", err)
	name := regexp.MustCompile(`nwtb-[0-9a-f]{6}-node`).FindString(err.Error())
	if name == "" {
		t.Fatalf("error does not name the node netns: %v", err)
	}
	if _, serr := os.Stat(NetNSDir + "/" + name); !os.IsNotExist(serr) {
		t.Errorf("netns %s left behind after failed New (stat: %v)", name, serr)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without address families succeeded")
	}
}
