package iptables

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/sortedset"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// tierBed is a node with five pods (a to e, IPv4 and IPv6) and servers on TCP 80, 81 and 8080
// and UDP 80 in every pod and the node, on which a Backend of one iptables variant runs.
type tierBed struct {
	t    *testing.T
	bed  *testbed.Bed
	pods map[string]*testbed.Pod
	be   *Backend
	mode xtables.Mode
}

func newTierBed(t *testing.T, mode xtables.Mode) *tierBed {
	kerneltest.Require(t, "ip", "ipset", "iptables-"+string(mode)+"-restore", "ip6tables-"+string(mode)+"-restore")
	bed, err := testbed.New(testbed.Config{IPv4: true, IPv6: true, TCPPorts: []uint16{80, 81, 8080}, UDPPorts: []uint16{80}, SCTPPorts: []uint16{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Errorf("closing the bed: %v", err)
		}
	})
	tb := &tierBed{t: t, bed: bed, pods: map[string]*testbed.Pod{}, mode: mode}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		p, err := bed.AddPod("x", name)
		if err != nil {
			t.Fatal(err)
		}
		tb.pods[name] = p
	}
	tb.inNode(func() (err error) {
		tb.be, err = New(context.Background(), mode)
		return err
	})
	return tb
}

// inNode runs fn in the node's network namespace: the iptables and ipset commands it starts
// work on the node's tables, never the host's.
func (tb *tierBed) inNode(fn func() error) {
	tb.t.Helper()
	if err := tb.bed.InNode(fn); err != nil {
		tb.t.Fatal(err)
	}
}

func (tb *tierBed) sync(rs *policy.Ruleset, wantFull bool) {
	tb.t.Helper()
	tb.inNode(func() error {
		res, err := tb.be.Sync(context.Background(), rs)
		if err != nil {
			return err
		}
		if res.Full != wantFull || res.Fallback != "" {
			return fmt.Errorf("sync result %+v, want full=%v and no fallback", res, wantFull)
		}
		return tb.be.Verify(context.Background())
	})
}

// ips returns the addresses of the named pods, both families.
func (tb *tierBed) ips(names ...string) []netip.Addr {
	var out []netip.Addr
	for _, n := range names {
		out = append(out, tb.pods[n].IPs()...)
	}
	return out
}

// flow is one connection the test expects to pass or be dropped, in both families.
type flow struct {
	src, dst string // pod names; dst "node" is the node's own address
	proto    testbed.Protocol
	port     uint16
	allowed  bool
	why      string
}

// check probes every flow in both families, and every other pair of pods (and pod to node) on
// each port against the model of the tiers judged from rs (refAllowed). A flow that should be
// dropped must time out: a refused connection means something rejected it.
func (tb *tierBed) check(step string, rs *policy.Ruleset, flows []flow) {
	tb.t.Helper()
	type probe struct {
		p    testbed.Probe
		want bool
		why  string
	}
	var probes []probe
	seen := map[string]bool{}
	add := func(f flow) {
		for _, fam := range []int{4, 6} {
			src := tb.pods[f.src]
			dst := tb.bed.NodeIP(fam)
			if f.dst != "node" {
				dst = tb.pods[f.dst].IP(fam)
			}
			key := fmt.Sprintf("%s %s %s %d", src.IP(fam), dst, f.proto, f.port)
			if seen[key] {
				continue
			}
			seen[key] = true
			proto := policy.TCP
			if f.proto == testbed.UDP {
				proto = policy.UDP
			}
			model := refAllowed(rs, packet{src: src.IP(fam), dst: dst, proto: proto, dport: f.port}, f.dst == "node")
			want, why := model, "the model"
			if f.why != "" {
				if f.allowed != model {
					tb.t.Fatalf("%s: the test expects %s -> %s %s/%d allowed=%v (%s) but the model says %v", step, f.src, f.dst, f.proto, f.port, f.allowed, f.why, model)
				}
				want, why = f.allowed, f.why
			}
			probes = append(probes, probe{p: testbed.Probe{Src: src, Dst: dst, Port: f.port, Protocol: f.proto}, want: want, why: why})
		}
	}
	for _, f := range flows {
		add(f)
	}
	for _, src := range []string{"a", "b", "c", "d", "e"} {
		for _, dst := range []string{"a", "b", "c", "d", "e", "node"} {
			if src == dst {
				continue
			}
			for _, port := range []uint16{80, 81, 8080} {
				add(flow{src: src, dst: dst, proto: testbed.TCP, port: port})
			}
			add(flow{src: src, dst: dst, proto: testbed.UDP, port: 80})
		}
	}
	ps := make([]testbed.Probe, len(probes))
	for i, p := range probes {
		ps[i] = p.p
	}
	errs := tb.bed.ProbeAllResults(context.Background(), ps)
	for i, p := range probes {
		err := errs[i]
		// A probe that should pass may time out on a starved machine: it gets two more
		// tries. A probe that should be dropped and passes fails at once.
		for try := 0; p.want && err != nil && try < 2; try++ {
			_, err = tb.bed.ProbeResult(context.Background(), p.p)
		}
		switch {
		case p.want && err != nil:
			tb.t.Errorf("%s (%s): %s blocked, want allowed (%s): %v", step, tb.mode, p.p, p.why, err)
		case !p.want && err == nil:
			tb.t.Errorf("%s (%s): %s allowed, want dropped (%s)", step, tb.mode, p.p, p.why)
		case !p.want && (errors.Is(err, syscall.ECONNREFUSED) || !isTimeout(err)):
			tb.t.Errorf("%s (%s): %s was refused, not dropped (%s): %v", step, tb.mode, p.p, p.why, err)
		}
	}
	if tb.t.Failed() {
		tb.inNode(func() error {
			tb.t.Logf("kernel state:\n%s", ours(tb.t, tb.mode))
			return nil
		})
		tb.t.FailNow()
	}
}

// isTimeout tells a probe that got no answer from one that was answered with a refusal.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// tierScenario builds the Rulesets of the kernel test. Names follow the compiler's shapes,
// but everything is built by hand.
type tierScenario struct {
	tb *tierBed
	rs *policy.Ruleset
}

func (s *tierScenario) addrSet(name string, pods ...string) {
	addrs := s.tb.ips(pods...)
	slices.SortFunc(addrs, netip.Addr.Compare)
	s.rs.AddrSets[name] = &policy.AddrSet{Addrs: sortedset.Of(addrs...)}
}

func (s *tierScenario) np(pod string, dir policy.Direction, name string, rules ...policy.Rule) {
	chain := policy.PolicyChainName(dir, "x", name)
	s.rs.Policies[chain] = &policy.PolicyRules{Direction: dir, Source: "x/" + name, Rules: rules}
	grp := "grp-" + string(dir) + "-" + name
	s.rs.Groups[grp] = policy.Group{Direction: dir, Policies: []string{chain}}
	for _, ip := range s.tb.ips(pod) {
		s.rs.Dispatch[dir][ip] = grp
	}
}

func (s *tierScenario) cnp(tier policy.TierName, dir policy.Direction, name string, prio int32, rules ...policy.ClusterRule) string {
	chain := string(tier) + "/" + string(dir) + "/" + name
	s.rs.ClusterPolicies[chain] = &policy.ClusterPolicyRules{Tier: tier, Direction: dir, Source: name, Priority: prio, Rules: rules}
	return chain
}

// group makes pods subjects of a tier group of the listed policies, judged in that order.
func (s *tierScenario) group(tier policy.TierName, dir policy.Direction, name string, policies []string, pods ...string) {
	t := s.rs.Tier(tier)
	t.Groups[name] = policy.Group{Direction: dir, Policies: policies}
	for _, ip := range s.tb.ips(pods...) {
		t.Dispatch[dir][ip] = name
	}
}

func tcpPorts(first, last uint16) []policy.PortMatch {
	return []policy.PortMatch{{Protocol: policy.TCP, Ranges: []policy.PortRange{{First: first, Last: last}}}}
}

// baseScenario is the first step's Ruleset:
//
//   - NetworkPolicy isolates b for ingress admitting nothing, c for ingress admitting all, and
//     d for egress admitting nothing.
//   - Admin, ingress of b: "b-pass-c" passes anything from c (to NetworkPolicy, which drops
//     it), then "b-accept-80" accepts TCP 80 from any peer, overriding b's isolation.
//   - Admin, ingress of c: "c-deny-a" denies anything from a, over c's NetworkPolicy.
//   - Admin, egress of d: "d-accept-web" accepts TCP 80-81 to any peer, overriding d's egress
//     isolation; the ingress side is still judged.
//   - Admin, egress of a: "a-first" (deny TCP 80 to e) and then "a-second" (accept anything to
//     e): the first listed policy's rule decides.
//   - Baseline, ingress of e (not isolated): pass from c, then deny from b's addresses (CIDR
//     peers, one per family), then deny the named port "web" (81 on e, 8080 on d).
//   - Baseline, ingress of c (isolated by NetworkPolicy, so never reached): deny all.
func baseScenario(tb *tierBed) *tierScenario {
	s := &tierScenario{tb: tb, rs: policy.NewRuleset()}
	s.addrSet("pods-a", "a")
	s.addrSet("pods-c", "c")
	s.addrSet("pods-e", "e")
	b4, b6 := tb.pods["b"].IPv4, tb.pods["b"].IPv6
	s.rs.CIDRSets["cidr-b4"] = &policy.CIDRSet{Prefixes: []netip.Prefix{netip.PrefixFrom(b4, 32)}}
	s.rs.CIDRSets["cidr-b6"] = &policy.CIDRSet{IPv6: true, Prefixes: []netip.Prefix{netip.PrefixFrom(b6, 128)}}
	var web []netip.AddrPort
	for _, ip := range tb.ips("e") {
		web = append(web, netip.AddrPortFrom(ip, 81))
	}
	for _, ip := range tb.ips("d") {
		web = append(web, netip.AddrPortFrom(ip, 8080))
	}
	s.rs.NamedPortSets["port-web-tcp"] = &policy.NamedPortSet{Entries: sortedset.Of(web...)}

	s.np("b", policy.Ingress, "deny-b")
	s.np("c", policy.Ingress, "allow-c", policy.Rule{})
	s.np("d", policy.Egress, "deny-d")

	passC := s.cnp(policy.AdminTier, policy.Ingress, "b-pass-c", 10, policy.ClusterRule{Action: policy.Pass, Peers: []policy.Peer{{AddrSet: "pods-c"}}})
	accept80 := s.cnp(policy.AdminTier, policy.Ingress, "b-accept-80", 20, policy.ClusterRule{Action: policy.Accept, Ports: tcpPorts(80, 80)})
	s.group(policy.AdminTier, policy.Ingress, "admin-ingress-b", []string{passC, accept80}, "b")
	denyA := s.cnp(policy.AdminTier, policy.Ingress, "c-deny-a", 10, policy.ClusterRule{Action: policy.Deny, Peers: []policy.Peer{{AddrSet: "pods-a"}}})
	s.group(policy.AdminTier, policy.Ingress, "admin-ingress-c", []string{denyA}, "c")
	web80 := s.cnp(policy.AdminTier, policy.Egress, "d-accept-web", 5, policy.ClusterRule{Action: policy.Accept, Ports: tcpPorts(80, 81)})
	s.group(policy.AdminTier, policy.Egress, "admin-egress-d", []string{web80}, "d")
	first := s.cnp(policy.AdminTier, policy.Egress, "a-first", 1, policy.ClusterRule{Action: policy.Deny, Peers: []policy.Peer{{AddrSet: "pods-e"}}, Ports: tcpPorts(80, 80)})
	second := s.cnp(policy.AdminTier, policy.Egress, "a-second", 2, policy.ClusterRule{Action: policy.Accept, Peers: []policy.Peer{{AddrSet: "pods-e"}}})
	s.group(policy.AdminTier, policy.Egress, "admin-egress-a", []string{first, second}, "a")

	blE := s.cnp(policy.BaselineTier, policy.Ingress, "e-baseline", 1,
		policy.ClusterRule{Action: policy.Pass, Peers: []policy.Peer{{AddrSet: "pods-c"}}},
		policy.ClusterRule{Action: policy.Deny, Peers: []policy.Peer{{CIDRSet: "cidr-b4"}, {CIDRSet: "cidr-b6", IPv6: true}}},
		policy.ClusterRule{Action: policy.Deny, Ports: []policy.PortMatch{{Protocol: policy.TCP, NamedPortSet: "port-web-tcp"}}})
	s.group(policy.BaselineTier, policy.Ingress, "baseline-ingress-e", []string{blE}, "e")
	blC := s.cnp(policy.BaselineTier, policy.Ingress, "c-baseline", 1, policy.ClusterRule{Action: policy.Deny})
	s.group(policy.BaselineTier, policy.Ingress, "baseline-ingress-c", []string{blC}, "c")
	return s
}

// TestKernelTiers programs ClusterNetworkPolicy tiers with NetworkPolicy into a node of real
// pods, on iptables-nft and iptables-legacy, and probes real connections in both families:
// each step's key flows by hand, and every pair of pods (and pod to node) on each port against
// the tier model. Changes go in as incremental syncs (a policy order swapped, actions changed,
// the tiers removed), each verified, with deferred removals compacted; the incremental state
// equals what a full sync writes, and cleanup leaves nothing.
func TestKernelTiers(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			tb := newTierBed(t, mode)
			s := baseScenario(tb)
			tb.sync(s.rs, true)
			tb.check("base", s.rs, []flow{
				{src: "a", dst: "b", proto: testbed.TCP, port: 80, allowed: true, why: "admin accept overrides b's NetworkPolicy isolation"},
				{src: "a", dst: "b", proto: testbed.TCP, port: 81, allowed: false, why: "no admin rule: b's NetworkPolicy drops"},
				{src: "c", dst: "b", proto: testbed.TCP, port: 80, allowed: false, why: "admin pass from c goes to NetworkPolicy, which drops; the later accept is not reached"},
				{src: "a", dst: "c", proto: testbed.TCP, port: 80, allowed: false, why: "admin deny over c's NetworkPolicy allow"},
				{src: "b", dst: "c", proto: testbed.TCP, port: 80, allowed: true, why: "c's NetworkPolicy allows; its baseline deny-all is skipped"},
				{src: "d", dst: "e", proto: testbed.TCP, port: 80, allowed: true, why: "admin egress accept (port range) overrides d's egress isolation"},
				{src: "d", dst: "e", proto: testbed.TCP, port: 8080, allowed: false, why: "outside the admin range: d's egress NetworkPolicy drops"},
				{src: "d", dst: "node", proto: testbed.TCP, port: 81, allowed: true, why: "admin egress accept to the node"},
				{src: "d", dst: "node", proto: testbed.UDP, port: 80, allowed: false, why: "UDP is outside the admin accept: d's egress isolation"},
				{src: "d", dst: "b", proto: testbed.TCP, port: 81, allowed: false, why: "egress accepted by admin, ingress still judged: b's NetworkPolicy drops"},
				{src: "d", dst: "b", proto: testbed.TCP, port: 80, allowed: true, why: "egress accepted by admin, ingress accepted by b's admin"},
				{src: "a", dst: "e", proto: testbed.TCP, port: 80, allowed: false, why: "the first policy's deny decides over the second's accept"},
				{src: "a", dst: "e", proto: testbed.TCP, port: 8080, allowed: true, why: "the second policy accepts"},
				{src: "b", dst: "e", proto: testbed.TCP, port: 80, allowed: false, why: "baseline deny of b's CIDR for e, not isolated"},
				{src: "b", dst: "e", proto: testbed.UDP, port: 80, allowed: false, why: "baseline deny of b's CIDR, any protocol"},
				{src: "c", dst: "e", proto: testbed.TCP, port: 81, allowed: true, why: "baseline pass from c allows, ahead of the named-port deny"},
				{src: "a", dst: "e", proto: testbed.TCP, port: 81, allowed: false, why: "baseline deny of the named port web (81 on e)"},
				{src: "d", dst: "e", proto: testbed.TCP, port: 81, allowed: false, why: "admin egress accept, then e's baseline named-port deny"},
				{src: "b", dst: "d", proto: testbed.TCP, port: 8080, allowed: true, why: "no policy judges d's ingress"},
			})

			// Someone else's edits of the tier chains are detected and repaired.
			tb.inNode(func() error {
				ipt, ip6t := "iptables-"+string(mode), "ip6tables-"+string(mode)
				for _, edit := range [][]string{
					{ipt, "-I", chainAdminIngress, "1", "-j", "RETURN"},
					{ip6t, "-F", adminChain("admin-egress-a")},
					{ipt, "-D", baselineChain("baseline-ingress-e"), "1"},
					{ipt, "-R", chainForward, "3", "-j", chainIngress},
				} {
					run(t, edit[0], append([]string{"-t", Table}, edit[1:]...)...)
					if err := tb.be.Verify(context.Background()); err == nil {
						return fmt.Errorf("verify did not notice %v", edit)
					}
					if _, err := tb.be.FullSync(context.Background(), s.rs); err != nil {
						return err
					}
					if err := tb.be.Verify(context.Background()); err != nil {
						return fmt.Errorf("verify after repairing %v: %w", edit, err)
					}
				}
				return nil
			})

			// Incremental: swap a's two egress policies, and change c-deny-a to pass and
			// b-pass-c to deny.
			next := baseScenario(tb)
			g := next.rs.Admin.Groups["admin-egress-a"]
			g.Policies = []string{g.Policies[1], g.Policies[0]}
			next.rs.Admin.Groups["admin-egress-a"] = g
			next.rs.ClusterPolicies["admin/ingress/c-deny-a"].Rules[0].Action = policy.Pass
			next.rs.ClusterPolicies["admin/ingress/b-pass-c"].Rules[0].Action = policy.Deny
			tb.sync(next.rs, false)
			tb.check("reordered and actions changed", next.rs, []flow{
				{src: "a", dst: "e", proto: testbed.TCP, port: 80, allowed: true, why: "a-second now comes first and accepts"},
				{src: "a", dst: "c", proto: testbed.TCP, port: 80, allowed: true, why: "admin pass, and c's NetworkPolicy allows"},
				{src: "c", dst: "b", proto: testbed.TCP, port: 80, allowed: false, why: "admin deny from c"},
				{src: "e", dst: "b", proto: testbed.TCP, port: 80, allowed: true, why: "admin accept of TCP 80"},
			})
			// The incremental path leaves what a full sync writes (after compaction).
			tb.inNode(func() error {
				if _, err := tb.be.Compact(context.Background()); err != nil {
					return err
				}
				if err := tb.be.Verify(context.Background()); err != nil {
					return err
				}
				incremental := ours(t, mode)
				fresh, err := New(context.Background(), mode)
				if err != nil {
					return err
				}
				if _, err := fresh.FullSync(context.Background(), next.rs); err != nil {
					return err
				}
				if full := ours(t, mode); full != incremental {
					return fmt.Errorf("incremental and full sync differ:\nincremental:\n%s\nfull:\n%s", incremental, full)
				}
				return tb.be.Verify(context.Background())
			})

			// A pod leaves the Admin tier (e joins a's egress group; d leaves its own),
			// incrementally: d's Admin dispatch rule goes, deferred on iptables-nft.
			moved := baseScenario(tb)
			for _, ip := range tb.ips("d") {
				delete(moved.rs.Admin.Dispatch[policy.Egress], ip)
			}
			for _, ip := range tb.ips("e") {
				moved.rs.Admin.Dispatch[policy.Egress][ip] = "admin-egress-a"
			}
			tb.sync(moved.rs, false)
			tb.check("pods moved", moved.rs, []flow{
				{src: "d", dst: "e", proto: testbed.TCP, port: 80, allowed: false, why: "d left the admin tier: its egress isolation drops"},
				{src: "e", dst: "d", proto: testbed.TCP, port: 8080, allowed: true, why: "e's admin egress: no rule for d, not isolated"},
			})

			// The tiers removed: NetworkPolicy alone again, as it would render without them.
			plain := baseScenario(tb)
			plain.rs.Admin, plain.rs.Baseline = policy.NewRuleset().Admin, policy.NewRuleset().Baseline
			plain.rs.ClusterPolicies = map[string]*policy.ClusterPolicyRules{}
			tb.sync(plain.rs, false)
			tb.check("tiers removed", plain.rs, []flow{
				{src: "a", dst: "b", proto: testbed.TCP, port: 80, allowed: false, why: "b's NetworkPolicy isolation"},
				{src: "b", dst: "e", proto: testbed.TCP, port: 80, allowed: true, why: "no baseline any more"},
			})
			tb.inNode(func() error {
				if _, err := tb.be.Compact(context.Background()); err != nil {
					return err
				}
				if err := tb.be.Verify(context.Background()); err != nil {
					return err
				}
				got := ours(t, mode)
				for _, gone := range []string{chainAdminEgress, chainAdminIngress, adminGroupPrefix, baselineGroupPrefix} {
					if strings.Contains(got, gone) {
						return fmt.Errorf("%s left after the tiers were removed:\n%s", gone, got)
					}
				}
				if err := tb.be.Cleanup(context.Background()); err != nil {
					return err
				}
				if got := ours(t, mode); got != "" {
					return fmt.Errorf("left after cleanup:\n%s", got)
				}
				return nil
			})
			// With everything removed, nothing is judged: a flow every step dropped passes.
			tb.check("cleaned up", policy.NewRuleset(), []flow{
				{src: "a", dst: "b", proto: testbed.TCP, port: 81, allowed: true, why: "nothing installed"},
			})
		})
	}
}

// TestKernelTiersCleanupPending: a full sync of the tiers, then Cleanup, leaves no chain
// or set of ours in either variant, even with deferred removals pending.
func TestKernelTiersCleanupPending(t *testing.T) {
	tb := newTierBed(t, xtables.ModeNFT)
	s := baseScenario(tb)
	tb.sync(s.rs, true)
	moved := baseScenario(tb)
	for _, ip := range tb.ips("d") {
		delete(moved.rs.Admin.Dispatch[policy.Egress], ip)
	}
	tb.sync(moved.rs, false)
	tb.inNode(func() error {
		if !tb.be.CompactionPending() {
			return errors.New("removing a pod from the admin tier deferred nothing on iptables-nft")
		}
		if err := tb.be.Cleanup(context.Background()); err != nil {
			return err
		}
		if got := ours(t, xtables.ModeNFT); got != "" {
			return fmt.Errorf("left after cleanup:\n%s", got)
		}
		return nil
	})
}

// TestKernelCompiledTiers loads what the compiler makes of real ClusterNetworkPolicies (node
// peers, named ports of every protocol, a rule of an unknown protocol (left out), CIDRs of both
// families) into each iptables variant, changes it incrementally (a pod more, a new priority),
// and requires that the kernel holds what was rendered (Verify), the same as a full sync, and
// nothing after cleanup.
func TestKernelCompiledTiers(t *testing.T) {
	// With drop logging too: its rules must read back from iptables-save as rendered, or
	// Verify would repair them on every resync.
	for _, log := range []*policy.DropLog{nil, {Group: 9, Rate: 10, Burst: 20}} {
		for _, mode := range modes {
			name := string(mode)
			if log != nil {
				name += "/log-drops"
			}
			t.Run(name, func(t *testing.T) { testCompiledTiers(t, mode, log) })
		}
	}
}

func testCompiledTiers(t *testing.T, mode xtables.Mode, log *policy.DropLog) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		b, err := New(ctx, mode)
		if err != nil {
			t.Fatal(err)
		}
		b.SetDropLog(log)
		if _, err := b.Sync(ctx, compiledTiers(2, 10)); err != nil {
			t.Fatalf("full sync: %v", err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify: %v\n%s", err, ours(t, mode))
		}
		rs2 := compiledTiers(3, 11)
		if res, err := b.Sync(ctx, rs2); err != nil || res.Full || res.Fallback != "" {
			t.Fatalf("incremental sync: %+v %v", res, err)
		}
		if _, err := b.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after the change: %v", err)
		}
		incremental := ours(t, mode)
		if strings.Contains(incremental, "--dport 0 ") || !strings.Contains(incremental, chainAdminEgress) {
			t.Fatalf("the tiers are not in the kernel:\n%s", incremental)
		}
		if hasLog := strings.Contains(incremental, "-j NFLOG --nflog-prefix \"nw:c-") && strings.Contains(incremental, "--nflog-prefix \"nw:g-"); hasLog != (log != nil) {
			t.Fatalf("NFLOG rules for CNP denies and group drops: %v, want %v:\n%s", hasLog, log != nil, incremental)
		}
		fresh, err := New(ctx, mode)
		if err != nil {
			t.Fatal(err)
		}
		fresh.SetDropLog(log)
		if _, err := fresh.FullSync(ctx, rs2); err != nil {
			t.Fatal(err)
		}
		if full := ours(t, mode); full != incremental {
			t.Fatalf("incremental and full sync differ:\nincremental:\n%s\nfull:\n%s", incremental, full)
		}
		if err := fresh.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if got := ours(t, mode); got != "" {
			t.Fatalf("left after cleanup:\n%s", got)
		}
	})
}
