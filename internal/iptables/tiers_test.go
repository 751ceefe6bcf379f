package iptables

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/sortedset"
)

// packet is a new connection's first packet as the filter table sees it.
type packet struct {
	src, dst netip.Addr
	proto    policy.Protocol
	dport    uint16
}

func (p packet) String() string { return fmt.Sprintf("%s -> %s %s/%d", p.src, p.dst, p.proto, p.dport) }

// evalChains runs a packet through our chains of one family the way the kernel does, from
// start (NETWARDEN-FORWARD or -INPUT, entered with -j from the built-in chain): -j pushes the
// caller, -g does not, RETURN and the end of a chain go back to the last caller. It returns
// whether the packet leaves our chains allowed (back in the built-in chain) or is dropped, and
// how many rules it crossed. Every rule must be one the renderer writes; a rule naming a
// missing chain or set, or a set of the other family, fails the test.
func evalChains(t *testing.T, r *Rendered, start string, p packet) (allowed bool, crossed int) {
	t.Helper()
	return evalChainsTrace(t, r, start, p, nil)
}

// evalChainsTrace is evalChains calling visit, when set, with every chain the packet enters.
func evalChainsTrace(t *testing.T, r *Rendered, start string, p packet, visit func(chain string)) (allowed bool, crossed int) {
	t.Helper()
	fam := famOf(p.src)
	chains := r.Chains[fam]
	type frame struct {
		chain string
		pos   int
	}
	var stack []frame
	cur := frame{chain: start}
	for steps := 0; ; steps++ {
		if steps > 100000 {
			t.Fatalf("%s: evaluation does not end", p)
		}
		rules, ok := chains[cur.chain]
		if !ok {
			t.Fatalf("%s: chain %s does not exist", p, cur.chain)
		}
		if visit != nil && cur.pos == 0 {
			visit(cur.chain)
		}
		if cur.pos >= len(rules) {
			if len(stack) == 0 {
				return true, crossed
			}
			cur, stack = stack[len(stack)-1], stack[:len(stack)-1]
			continue
		}
		rule := rules[cur.pos]
		cur.pos++
		crossed++
		verb, target, match := matchRule(t, r, fam, rule, p)
		if !match {
			continue
		}
		switch {
		case verb == "-j" && target == "RETURN":
			if len(stack) == 0 {
				return true, crossed
			}
			cur, stack = stack[len(stack)-1], stack[:len(stack)-1]
		case verb == "-j" && target == "DROP":
			return false, crossed
		case verb == "-j" && target == "ACCEPT":
			return true, crossed
		case verb == "-j":
			stack = append(stack, cur)
			cur = frame{chain: target}
		default:
			cur = frame{chain: target}
		}
	}
}

// matchRule parses one rule specification and reports whether it matches p, and its verb (-j
// or -g) and target.
func matchRule(t *testing.T, r *Rendered, fam int, rule string, p packet) (verb, target string, match bool) {
	t.Helper()
	f := strings.Fields(rule)
	match = true
	bad := func() { t.Fatalf("rule %q: unexpected form", rule) }
	for i := 0; i < len(f); {
		switch f[i] {
		case "-s", "-d":
			pfx, err := netip.ParsePrefix(f[i+1])
			if err != nil {
				bad()
			}
			a := p.src
			if f[i] == "-d" {
				a = p.dst
			}
			match = match && pfx.Contains(a)
			i += 2
		case "-p":
			match = match && f[i+1] == string(p.proto)
			i += 2
		case "-m":
			switch mod := f[i+1]; mod {
			case "conntrack": // -m conntrack [!] --ctstate STATES: a new connection is NEW
				not := f[i+2] == "!"
				if not {
					i++
				}
				if f[i+2] != "--ctstate" {
					bad()
				}
				isNew := slices.Contains(strings.Split(f[i+3], ","), "NEW")
				match = match && isNew != not
				i += 4
			case "icmp6":
				match = false // -p ipv6-icmp already failed for our packets
				i += 4
			case "tcp", "udp", "sctp":
				if f[i+2] != "--dport" || !strings.HasPrefix(rule, "-p "+mod+" ") {
					bad() // the port match only ever comes with its own -p
				}
				lo, hi, _ := strings.Cut(f[i+3], ":")
				first, err1 := strconv.Atoi(lo)
				last := first
				var err2 error
				if hi != "" {
					last, err2 = strconv.Atoi(hi)
				}
				if err1 != nil || err2 != nil {
					bad()
				}
				match = match && string(p.proto) == mod && first <= int(p.dport) && int(p.dport) <= last
				i += 4
			case "set":
				if f[i+2] != "--match-set" {
					bad()
				}
				match = inSet(t, r, fam, f[i+3], f[i+4], p) && match
				i += 5
			default:
				bad()
			}
		case "-j", "-g":
			if i+2 != len(f) {
				bad()
			}
			return f[i], f[i+1], match
		default:
			bad()
		}
	}
	bad()
	return
}

func inSet(t *testing.T, r *Rendered, fam int, name, dirs string, p packet) bool {
	t.Helper()
	s, ok := r.Sets[name]
	if !ok {
		t.Fatalf("set %s does not exist", name)
	}
	if s.v6 != (fam == v6) {
		t.Fatalf("set %s of the other family used", name)
	}
	addr := p.src
	if strings.HasPrefix(dirs, "dst") {
		addr = p.dst
	}
	members := s.Elements()
	switch s.typ {
	case "hash:ip":
		return members[addr.String()]
	case "hash:net":
		for m := range members {
			pfx, err := netip.ParsePrefix(m)
			if err != nil {
				pfx = netip.PrefixFrom(netip.MustParseAddr(m), addr.BitLen())
			}
			if pfx.Contains(addr) {
				return true
			}
		}
		return false
	case "hash:ip,port":
		if dirs != "dst,dst" {
			t.Fatalf("named port set %s matched with %s", name, dirs)
		}
		return members[fmt.Sprintf("%s,%s:%d", addr, p.proto, p.dport)]
	}
	t.Fatalf("set %s of type %s", name, s.typ)
	return false
}

// The reference: the semantics of the tiers as the design states them, judged straight from
// the Ruleset.

func refPeer(rs *policy.Ruleset, peers []policy.Peer, a netip.Addr) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		switch {
		case p.AddrSet != "":
			if rs.AddrSets[p.AddrSet].Addrs.Contains(a) {
				return true
			}
		case p.CIDRSet != "":
			cs := rs.CIDRSets[p.CIDRSet]
			if cs.IPv6 == a.Is6() && slices.ContainsFunc(cs.Prefixes, func(q netip.Prefix) bool { return q.Contains(a) }) {
				return true
			}
		}
	}
	return false
}

func refPort(rs *policy.Ruleset, ports []policy.PortMatch, p packet) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pm := range ports {
		switch {
		case pm.Protocol == "":
			return true
		case pm.Protocol != p.proto:
		case pm.NamedPortSet != "":
			if rs.NamedPortSets[pm.NamedPortSet].Entries.Contains(netip.AddrPortFrom(p.dst, p.dport)) {
				return true
			}
		case len(pm.Ranges) == 0:
			return true
		default:
			for _, r := range pm.Ranges {
				if r.First <= p.dport && p.dport <= r.Last {
					return true
				}
			}
		}
	}
	return false
}

// refTier returns the action of the first rule of the group's policies that matches, or "".
func refTier(rs *policy.Ruleset, t *policy.Tier, dir policy.Direction, local, peer netip.Addr, p packet) policy.Action {
	g, ok := t.Dispatch[dir][local]
	if !ok {
		return ""
	}
	for _, name := range t.Groups[g].Policies {
		cp := rs.ClusterPolicies[name]
		if cp == nil {
			continue
		}
		for _, r := range cp.Rules {
			if refPeer(rs, r.Peers, peer) && refPort(rs, r.Ports, p) {
				return r.Action
			}
		}
	}
	return ""
}

// refDirection: Admin, then NetworkPolicy, then Baseline, then allow.
func refDirection(rs *policy.Ruleset, dir policy.Direction, p packet) bool {
	local, peer := p.dst, p.src
	if dir == policy.Egress {
		local, peer = p.src, p.dst
	}
	switch refTier(rs, &rs.Admin, dir, local, peer, p) {
	case policy.Accept:
		return true
	case policy.Deny:
		return false
	}
	if g, ok := rs.Dispatch[dir][local]; ok {
		for _, name := range rs.Groups[g].Policies {
			for _, r := range rs.Policies[name].Rules {
				if refPeer(rs, r.Peers, peer) && refPort(rs, r.Ports, p) {
					return true
				}
			}
		}
		return false
	}
	return refTier(rs, &rs.Baseline, dir, local, peer, p) != policy.Deny
}

// refForward: a forwarded packet must be allowed by egress and by ingress; one to the node by
// egress.
func refAllowed(rs *policy.Ruleset, p packet, toNode bool) bool {
	return refDirection(rs, policy.Egress, p) && (toNode || refDirection(rs, policy.Ingress, p))
}

// randomWorld is the addresses of a random test: local pods in a few blocks of 16, and some
// outside addresses.
type randomWorld struct {
	pods, outside []netip.Addr
}

func newRandomWorld() randomWorld {
	var w randomWorld
	for i := 1; i <= 40; i += 2 {
		w.pods = append(w.pods, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	for i := 1; i <= 20; i += 2 {
		w.pods = append(w.pods, netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(i)}))
	}
	w.outside = []netip.Addr{netip.MustParseAddr("192.0.2.5"), netip.MustParseAddr("10.0.0.2"),
		netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("fd00::2")}
	return w
}

func (w randomWorld) all() []netip.Addr { return append(slices.Clone(w.pods), w.outside...) }

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func randomSubset[T any](r *rand.Rand, s []T, p float64) []T {
	var out []T
	for _, v := range s {
		if r.Float64() < p {
			out = append(out, v)
		}
	}
	return out
}

var protocols = []policy.Protocol{policy.TCP, policy.UDP, policy.SCTP}

func randomPeers(r *rand.Rand, rs *policy.Ruleset) []policy.Peer {
	var peers []policy.Peer
	for range r.IntN(3) {
		if r.IntN(2) == 0 {
			peers = append(peers, policy.Peer{AddrSet: pick(r, slices.Sorted(maps.Keys(rs.AddrSets)))})
		} else {
			name := pick(r, slices.Sorted(maps.Keys(rs.CIDRSets)))
			peers = append(peers, policy.Peer{CIDRSet: name, IPv6: rs.CIDRSets[name].IPv6})
		}
	}
	return peers
}

func randomPorts(r *rand.Rand, rs *policy.Ruleset, anyProtocol bool) []policy.PortMatch {
	var ports []policy.PortMatch
	for range r.IntN(3) {
		switch r.IntN(6) {
		case 0:
			if anyProtocol {
				ports = append(ports, policy.PortMatch{}) // every protocol
			}
		case 1:
			name := pick(r, slices.Sorted(maps.Keys(rs.NamedPortSets)))
			ports = append(ports, policy.PortMatch{Protocol: policy.Protocol(namedPortProto(name)), NamedPortSet: name})
		case 2:
			// What the compiler writes for a protocol it does not know: a port no packet has.
			ports = append(ports, policy.PortMatch{Protocol: policy.TCP, Ranges: []policy.PortRange{{}}})
		default:
			pm := policy.PortMatch{Protocol: pick(r, protocols)}
			for range r.IntN(3) {
				first := uint16(80 + r.IntN(3))
				pm.Ranges = append(pm.Ranges, policy.PortRange{First: first, Last: first + uint16(r.IntN(2))})
			}
			ports = append(ports, pm)
		}
	}
	return ports
}

// randomRuleset builds a Ruleset with NetworkPolicy groups and both tiers over w's pods.
//
// anyProtocol allows port matches of every protocol (Protocol ""), which the model allows but
// neither compiler writes (and Ruleset.Judge does not take).
func randomRuleset(r *rand.Rand, w randomWorld, anyProtocol bool) *policy.Ruleset {
	rs := policy.NewRuleset()
	all := w.all()
	for i := range 4 {
		addrs := randomSubset(r, all, 0.3)
		slices.SortFunc(addrs, netip.Addr.Compare)
		rs.AddrSets[fmt.Sprintf("pods-%d", i)] = &policy.AddrSet{Addrs: sortedset.Of(addrs...)}
	}
	for name, cidr := range map[string]string{"cidr-a": "10.0.0.0/28", "cidr-b": "0.0.0.0/0", "cidr-c": "fd00::/124", "cidr-d": "192.0.2.0/24"} {
		p := netip.MustParsePrefix(cidr)
		rs.CIDRSets[name] = &policy.CIDRSet{IPv6: p.Addr().Is6(), Prefixes: []netip.Prefix{p}}
	}
	for _, name := range []string{"port-http-tcp", "port-dns-udp"} {
		var entries []netip.AddrPort
		for _, a := range randomSubset(r, all, 0.5) {
			entries = append(entries, netip.AddrPortFrom(a, uint16(80+r.IntN(3))))
		}
		slices.SortFunc(entries, netip.AddrPort.Compare)
		rs.NamedPortSets[name] = &policy.NamedPortSet{Entries: sortedset.Of(entries...)}
	}
	dirs := []policy.Direction{policy.Ingress, policy.Egress}
	byDir := map[policy.Direction][]string{}
	for i := range 5 {
		dir := pick(r, dirs)
		name := fmt.Sprintf("np/%s/%d", dir, i)
		pr := &policy.PolicyRules{Direction: dir, Source: fmt.Sprintf("ns/np%d", i)}
		for range r.IntN(3) {
			pr.Rules = append(pr.Rules, policy.Rule{Peers: randomPeers(r, rs), Ports: randomPorts(r, rs, anyProtocol)})
		}
		rs.Policies[name] = pr
		byDir[dir] = append(byDir[dir], name)
	}
	for _, dir := range dirs {
		var groups []string
		for i := range 2 {
			g := fmt.Sprintf("grp-%s-%d", dir, i)
			pols := randomSubset(r, byDir[dir], 0.6)
			slices.Sort(pols)
			rs.Groups[g] = policy.Group{Direction: dir, Policies: pols}
			groups = append(groups, g)
		}
		for _, a := range w.pods {
			if r.Float64() < 0.35 {
				rs.Dispatch[dir][a] = pick(r, groups)
			}
		}
	}
	actions := []policy.Action{policy.Accept, policy.Deny, policy.Pass}
	cnps := map[policy.TierName]map[policy.Direction][]string{}
	for i := range 8 {
		tier := pick(r, []policy.TierName{policy.AdminTier, policy.BaselineTier})
		dir := pick(r, dirs)
		name := fmt.Sprintf("cnp/%s/%s/%d", tier, dir, i)
		cp := &policy.ClusterPolicyRules{Tier: tier, Direction: dir, Source: fmt.Sprintf("cnp%d", i), Priority: int32(r.IntN(100))}
		for range 1 + r.IntN(3) {
			cp.Rules = append(cp.Rules, policy.ClusterRule{Action: pick(r, actions), Peers: randomPeers(r, rs), Ports: randomPorts(r, rs, anyProtocol)})
		}
		rs.ClusterPolicies[name] = cp
		if cnps[tier] == nil {
			cnps[tier] = map[policy.Direction][]string{}
		}
		cnps[tier][dir] = append(cnps[tier][dir], name)
	}
	for _, tier := range []policy.TierName{policy.AdminTier, policy.BaselineTier} {
		t := rs.Tier(tier)
		for _, dir := range dirs {
			var groups []string
			for i := range 2 {
				g := fmt.Sprintf("%s-%s-%d", tier, dir, i)
				pols := randomSubset(r, cnps[tier][dir], 0.7)
				r.Shuffle(len(pols), func(i, j int) { pols[i], pols[j] = pols[j], pols[i] })
				t.Groups[g] = policy.Group{Direction: dir, Policies: pols}
				groups = append(groups, g)
			}
			for _, a := range w.pods {
				if r.Float64() < 0.4 {
					t.Dispatch[dir][a] = pick(r, groups)
				}
			}
		}
	}
	return rs
}

// mutate returns a copy of rs with some pods moved between groups (or out of them) and some
// tier groups' policies reordered or dropped, and one cluster policy's action changed.
func mutate(r *rand.Rand, rs *policy.Ruleset, w randomWorld) *policy.Ruleset {
	out := *rs
	out.Dispatch = cloneDispatch(rs.Dispatch)
	out.ClusterPolicies = maps.Clone(rs.ClusterPolicies)
	moveSome := func(d map[policy.Direction]map[netip.Addr]string, groups []string) {
		for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			var mine []string
			for _, g := range groups {
				if strings.Contains(g, string(dir)) {
					mine = append(mine, g)
				}
			}
			for _, a := range w.pods {
				switch x := r.Float64(); {
				case x < 0.1:
					delete(d[dir], a)
				case x < 0.2 && len(mine) > 0:
					d[dir][a] = pick(r, mine)
				}
			}
		}
	}
	moveSome(out.Dispatch, slices.Sorted(maps.Keys(rs.Groups)))
	for _, tier := range []*policy.Tier{&out.Admin, &out.Baseline} {
		tier.Dispatch = cloneDispatch(tier.Dispatch)
		tier.Groups = maps.Clone(tier.Groups)
		moveSome(tier.Dispatch, slices.Sorted(maps.Keys(tier.Groups)))
		for name, g := range tier.Groups {
			if r.IntN(3) == 0 {
				pols := slices.Clone(g.Policies)
				r.Shuffle(len(pols), func(i, j int) { pols[i], pols[j] = pols[j], pols[i] })
				if len(pols) > 0 && r.IntN(2) == 0 {
					pols = pols[1:]
				}
				g.Policies = pols
				tier.Groups[name] = g
			}
		}
	}
	names := slices.Sorted(maps.Keys(out.ClusterPolicies))
	if len(names) > 0 {
		name := pick(r, names)
		cp := *out.ClusterPolicies[name]
		cp.Rules = slices.Clone(cp.Rules)
		i := r.IntN(len(cp.Rules))
		cp.Rules[i].Action = pick(r, []policy.Action{policy.Accept, policy.Deny, policy.Pass})
		out.ClusterPolicies[name] = &cp
	}
	return &out
}

func cloneDispatch(d map[policy.Direction]map[netip.Addr]string) map[policy.Direction]map[netip.Addr]string {
	out := map[policy.Direction]map[netip.Addr]string{}
	for dir, m := range d {
		out[dir] = maps.Clone(m)
	}
	return out
}

// randomPackets returns n packets between w's addresses of one family, forwarded, and to the
// node (an address no pod has).
func randomPackets(r *rand.Rand, w randomWorld, n int) (fwd, toNode []packet) {
	all := w.all()
	for len(fwd) < n {
		src, dst := pick(r, all), pick(r, all)
		if src.Is6() != dst.Is6() || src == dst {
			continue
		}
		fwd = append(fwd, packet{src: src, dst: dst, proto: pick(r, protocols), dport: uint16(79 + r.IntN(4))})
	}
	for _, src := range w.pods {
		node := netip.MustParseAddr("10.0.0.254")
		if src.Is6() {
			node = netip.MustParseAddr("fd00::fe")
		}
		toNode = append(toNode, packet{src: src, dst: node, proto: pick(r, protocols), dport: uint16(79 + r.IntN(4))})
	}
	return fwd, toNode
}

// checkVerdicts evaluates every packet through r and requires the reference's verdict.
func checkVerdicts(t *testing.T, what string, rs *policy.Ruleset, r *Rendered, fwd, toNode []packet) {
	t.Helper()
	for _, p := range fwd {
		got, _ := evalChains(t, r, chainForward, p)
		if want := refAllowed(rs, p, false); got != want {
			t.Fatalf("%s: forwarded %s allowed=%v, want %v", what, p, got, want)
		}
	}
	// The policy package's own judge (what `netwarden explain` says) agrees, where it applies.
	if !hasAnyProtocol(rs) {
		for _, p := range fwd {
			judged := rs.Judge(policy.Egress, p.src, p.dst, p.proto, p.dport).Allowed &&
				rs.Judge(policy.Ingress, p.dst, p.src, p.proto, p.dport).Allowed
			if want := refAllowed(rs, p, false); judged != want {
				t.Fatalf("%s: %s: Ruleset.Judge says allowed=%v, the model %v", what, p, judged, want)
			}
		}
	}
	for _, p := range toNode {
		got, _ := evalChains(t, r, chainInput, p)
		if want := refAllowed(rs, p, true); got != want {
			t.Fatalf("%s: to the node %s allowed=%v, want %v", what, p, got, want)
		}
	}
}

func hasAnyProtocol(rs *policy.Ruleset) bool {
	for _, pr := range rs.Policies {
		for _, r := range pr.Rules {
			if slices.ContainsFunc(r.Ports, func(pm policy.PortMatch) bool { return pm.Protocol == "" }) {
				return true
			}
		}
	}
	for _, cp := range rs.ClusterPolicies {
		for _, r := range cp.Rules {
			if slices.ContainsFunc(r.Ports, func(pm policy.PortMatch) bool { return pm.Protocol == "" }) {
				return true
			}
		}
	}
	return false
}

// TestTiersJudgeAsModel renders random Rulesets with NetworkPolicy and both tiers and runs
// random packets through the rendered chains (an interpreter of the rules the renderer
// writes, sets included), requiring the verdict of the tier semantics judged straight from
// the Ruleset. It then applies random changes (pods moving between groups and tiers, a tier
// group's policies reordered, an action changed) and requires the same of the new rendering,
// of the kernel state with deferred removals (withDeferredRemovals), and that the Renderer's
// cached rendering equals a fresh one.
func TestTiersJudgeAsModel(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	w := newRandomWorld()
	deferredChecked := 0
	for round := range 60 {
		rs := randomRuleset(r, w, round%2 == 0)
		var rd Renderer
		old := rd.Render(rs)
		if old.Err() != nil {
			t.Fatal(old.Err())
		}
		fwd, toNode := randomPackets(r, w, 400)
		checkVerdicts(t, fmt.Sprintf("round %d", round), rs, old, fwd, toNode)
		for step := range 3 {
			next := mutate(r, rs, w)
			want := rd.Render(next)
			if want.Err() != nil {
				t.Fatal(want.Err())
			}
			what := fmt.Sprintf("round %d step %d", round, step)
			fresh := Render(next)
			for fam := range want.Chains {
				if !maps.EqualFunc(want.Chains[fam], fresh.Chains[fam], slices.Equal) {
					t.Fatalf("%s: the cached rendering differs from a fresh one", what)
				}
			}
			checkVerdicts(t, what, next, want, fwd, toNode)
			k := withDeferredRemovals(old, want)
			checkVerdicts(t, what+" (removals deferred)", next, k, fwd, toNode)
			if !diff(old, k).removes() {
				deferredChecked++
			}
			// Both the change and the compaction that follows it, applied to the chains as
			// restore would, leave exactly what they aim at.
			for _, step := range [][2]*Rendered{{old, k}, {k, want}, {old, want}} {
				for fam, got := range applyChainPlan(t, step[0], step[1]) {
					if !maps.EqualFunc(got, step[1].Chains[fam], slices.Equal) {
						t.Fatalf("%s: applying the plan does not lead to its target", what)
					}
				}
			}
			rs, old = next, want
		}
	}
	t.Logf("%d of 180 changes applicable by additions alone", deferredChecked)
	if deferredChecked == 0 {
		t.Error("no change was applicable by additions alone: the deferred path was not tested")
	}
}

// applyChainPlan applies the chain changes of the plan from -> to to from's chains as a
// restore would.
func applyChainPlan(t *testing.T, from, to *Rendered) [2]map[string][]string {
	t.Helper()
	p := diff(from, to)
	var out [2]map[string][]string
	for fam := range out {
		out[fam] = maps.Clone(from.Chains[fam])
		c := p.chains[fam]
		for _, name := range c.gone {
			delete(out[fam], name)
		}
		byChain := map[string][]string{}
		for _, e := range c.edits {
			chain := strings.Fields(e)[1]
			byChain[chain] = append(byChain[chain], e)
		}
		for chain, edits := range byChain {
			out[fam][chain] = applyEdits(t, chain, out[fam][chain], edits)
		}
		for _, name := range c.write {
			out[fam][name] = to.Chains[fam][name] // declared and written whole
		}
	}
	return out
}

// TestTierPacketWork: the rules a packet crosses are bounded by its own pods' policies, not by
// how many cluster policies and pods the node has: dispatch stays a tree.
func TestTierPacketWork(t *testing.T) {
	rs := policy.NewRuleset()
	// 250 local pods, each a subject of its own Admin group of its own policy, and 250 more
	// cluster policies in a Baseline group: a walk over all would cross hundreds of rules.
	for i := range 250 {
		ip := netip.AddrFrom4([4]byte{10, 244, 3, byte(i + 1)})
		name := fmt.Sprintf("cnp-%d", i)
		rs.ClusterPolicies["admin/"+name] = &policy.ClusterPolicyRules{Tier: policy.AdminTier, Direction: policy.Ingress, Source: name,
			Rules: []policy.ClusterRule{{Action: policy.Deny, Ports: []policy.PortMatch{{Protocol: policy.TCP, Ranges: []policy.PortRange{{First: 9, Last: 9}}}}}}}
		rs.ClusterPolicies["baseline/"+name] = &policy.ClusterPolicyRules{Tier: policy.BaselineTier, Direction: policy.Ingress, Source: name,
			Rules: []policy.ClusterRule{{Action: policy.Deny, Ports: []policy.PortMatch{{Protocol: policy.UDP, Ranges: []policy.PortRange{{First: 9, Last: 9}}}}}}}
		rs.Admin.Groups["a"+name] = policy.Group{Direction: policy.Ingress, Policies: []string{"admin/" + name}}
		rs.Admin.Dispatch[policy.Ingress][ip] = "a" + name
		rs.Baseline.Groups["b"+name] = policy.Group{Direction: policy.Ingress, Policies: []string{"baseline/" + name}}
		rs.Baseline.Dispatch[policy.Ingress][ip] = "b" + name
	}
	r := Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	most := 0
	for i := range 250 {
		p := packet{src: netip.MustParseAddr("10.244.9.9"), dst: netip.AddrFrom4([4]byte{10, 244, 3, byte(i + 1)}), proto: policy.TCP, dport: 80}
		allowed, crossed := evalChains(t, r, chainForward, p)
		if !allowed {
			t.Fatalf("%s dropped", p)
		}
		most = max(most, crossed)
	}
	// Prelude 1 + egress 1 (nothing) + admin: 16 blocks + 16 pods + the pod's 1 rule + end;
	// NP tree the same + the baseline group's 1 rule.
	if most > 80 {
		t.Errorf("a packet crosses up to %d rules", most)
	}
}

// tierRuleset is a small hand-built Ruleset with both tiers and NetworkPolicy: the pods at
// 10.0.0.1 (.2 with IPv6) are Admin subjects for ingress, 10.0.0.3 is isolated by NetworkPolicy
// for ingress and a Baseline subject too (so the Baseline is not reached for it), 10.0.0.4 a
// Baseline subject for egress.
func tierRuleset() *policy.Ruleset {
	rs := policy.NewRuleset()
	a := netip.MustParseAddr
	rs.AddrSets["pods-x"] = &policy.AddrSet{Addrs: sortedset.Of(a("10.0.0.9"), a("fd00::9"))}
	rs.CIDRSets["cidr-x"] = &policy.CIDRSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	rs.NamedPortSets["port-http-tcp"] = &policy.NamedPortSet{Entries: sortedset.Of(netip.MustParseAddrPort("10.0.0.1:8080"))}
	rs.Policies["in/a/np"] = &policy.PolicyRules{Direction: policy.Ingress, Source: "a/np",
		Rules: []policy.Rule{{Peers: []policy.Peer{{AddrSet: "pods-x"}}}}}
	rs.Groups["grp-ingress-np"] = policy.Group{Direction: policy.Ingress, Policies: []string{"in/a/np"}}
	rs.Dispatch[policy.Ingress][a("10.0.0.3")] = "grp-ingress-np"
	rs.ClusterPolicies["admin/ingress/first"] = &policy.ClusterPolicyRules{Tier: policy.AdminTier, Direction: policy.Ingress, Source: "first", Priority: 1,
		Rules: []policy.ClusterRule{
			{Name: "deny-cidr", Action: policy.Deny, Peers: []policy.Peer{{CIDRSet: "cidr-x"}}},
			{Name: "http", Action: policy.Accept, Ports: []policy.PortMatch{{Protocol: policy.TCP, NamedPortSet: "port-http-tcp"}}},
		}}
	rs.ClusterPolicies["admin/ingress/second"] = &policy.ClusterPolicyRules{Tier: policy.AdminTier, Direction: policy.Ingress, Source: "second", Priority: 2,
		Rules: []policy.ClusterRule{
			{Name: "pass-x", Action: policy.Pass, Peers: []policy.Peer{{AddrSet: "pods-x"}}, Ports: []policy.PortMatch{{Protocol: policy.TCP, Ranges: []policy.PortRange{{First: 80, Last: 89}}}}},
			{Name: "pass-all", Action: policy.Pass},
		}}
	rs.Admin.Groups["admin-ingress-1"] = policy.Group{Direction: policy.Ingress, Policies: []string{"admin/ingress/second", "admin/ingress/first"}}
	rs.Admin.Dispatch[policy.Ingress][a("10.0.0.1")] = "admin-ingress-1"
	rs.Admin.Dispatch[policy.Ingress][a("10.0.0.2")] = "admin-ingress-1"
	rs.Admin.Dispatch[policy.Ingress][a("fd00::2")] = "admin-ingress-1"
	rs.ClusterPolicies["baseline/egress/third"] = &policy.ClusterPolicyRules{Tier: policy.BaselineTier, Direction: policy.Egress, Source: "third", Priority: 3,
		Rules: []policy.ClusterRule{
			{Action: policy.Pass, Peers: []policy.Peer{{AddrSet: "pods-x"}}},
			{Action: policy.Deny, Ports: []policy.PortMatch{{Protocol: policy.UDP}}},
			{Action: policy.Accept},
		}}
	rs.Baseline.Groups["baseline-egress-1"] = policy.Group{Direction: policy.Egress, Policies: []string{"baseline/egress/third"}}
	rs.ClusterPolicies["baseline/ingress/fourth"] = &policy.ClusterPolicyRules{Tier: policy.BaselineTier, Direction: policy.Ingress, Source: "fourth", Priority: 4,
		Rules: []policy.ClusterRule{{Action: policy.Deny}}}
	rs.Baseline.Groups["baseline-ingress-1"] = policy.Group{Direction: policy.Ingress, Policies: []string{"baseline/ingress/fourth"}}
	rs.Baseline.Dispatch[policy.Egress][a("10.0.0.4")] = "baseline-egress-1"
	rs.Baseline.Dispatch[policy.Ingress][a("10.0.0.3")] = "baseline-ingress-1"
	return rs
}

// TestRenderTiers: the chain layout of a small Ruleset with both tiers, as `netwarden render`
// prints it.
func TestRenderTiers(t *testing.T) {
	r := Render(tierRuleset())
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	for name, want := range map[string][]string{
		chainForward: {"-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN", "-j " + chainEgress, "-j " + chainAdminIngress},
		chainInput:   {"-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN", "-j " + chainEgress},
		chainAdminIngress: {
			"-d 10.0.0.0/28 -g " + dispatchChain("AI4", netip.MustParsePrefix("10.0.0.0/28")),
			"-g " + chainIngress,
		},
		dispatchChain("AI4", netip.MustParsePrefix("10.0.0.0/28")): {
			"-d 10.0.0.1/32 -g " + adminChain("admin-ingress-1"),
			"-d 10.0.0.2/32 -g " + adminChain("admin-ingress-1"),
			"-g " + chainIngress,
		},
		// The policies in the group's order, not by name; the trailing Pass of "second" is
		// what the chain's end does anyway.
		adminChain("admin-ingress-1"): {
			"-p tcp -m set --match-set " + podSet("pods-x", v4) + " src -m tcp --dport 80:89 -g " + chainIngress,
			"-g " + chainIngress,
			"-m set --match-set " + cidrSet("cidr-x", v4) + " src -j DROP",
			"-p tcp -m set --match-set " + portSet("port-http-tcp", v4) + " dst,dst -j RETURN",
			"-g " + chainIngress,
		},
		// 10.0.0.3 is isolated by NetworkPolicy: it goes to its NP group, never the Baseline.
		chainIngress: {"-d 10.0.0.3/32 -g " + groupChain("grp-ingress-np")},
		chainEgress:  {"-s 10.0.0.4/32 -g " + baselineChain("baseline-egress-1")},
		baselineChain("baseline-egress-1"): {
			"-m set --match-set " + podSet("pods-x", v4) + " dst -j RETURN",
			"-p udp -j DROP",
		},
	} {
		if got := r.Chains[v4][name]; !slices.Equal(got, want) {
			t.Errorf("%s:\n got  %q\n want %q", name, got, want)
		}
	}
	if _, ok := r.Chains[v4][baselineChain("baseline-ingress-1")]; ok {
		t.Error("a Baseline group whose only pod NetworkPolicy isolates has a chain")
	}
	// IPv6: one Admin pod, led straight to its group; the CIDR rule is IPv4 only.
	for name, want := range map[string][]string{
		chainAdminIngress: {"-d fd00::2/128 -g " + adminChain("admin-ingress-1"), "-g " + chainIngress},
		adminChain("admin-ingress-1"): {
			"-p tcp -m set --match-set " + podSet("pods-x", v6) + " src -m tcp --dport 80:89 -g " + chainIngress,
			"-g " + chainIngress,
			"-p tcp -m set --match-set " + portSet("port-http-tcp", v6) + " dst,dst -j RETURN",
			"-g " + chainIngress,
		},
		chainEgress:  {},
		chainIngress: {},
	} {
		if got := r.Chains[v6][name]; !slices.Equal(got, want) {
			t.Errorf("IPv6 %s:\n got  %q\n want %q", name, got, want)
		}
	}
	golden(t, "tiers.golden", Dump(r))
}

// TestTierSetsKeptWhenPolicySkipped: a NetworkPolicy skipped fail-closed takes the sets only it
// used out of the rendering, but not those a ClusterNetworkPolicy still uses.
func TestTierSetsKeptWhenPolicySkipped(t *testing.T) {
	rs := tierRuleset()
	huge := make([]netip.Addr, maxSetElements+1)
	for i := range huge {
		huge[i] = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	rs.AddrSets["pods-huge"] = &policy.AddrSet{Addrs: sortedset.Of(huge...)}
	rs.Policies["in/a/np"] = &policy.PolicyRules{Direction: policy.Ingress, Source: "a/np",
		Rules: []policy.Rule{{Peers: []policy.Peer{{AddrSet: "pods-huge"}}}}}
	r := Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	if len(r.Skipped) != 1 {
		t.Fatalf("skipped %v", r.Skipped)
	}
	for _, name := range []string{podSet("pods-x", v4), cidrSet("cidr-x", v4), portSet("port-http-tcp", v4)} {
		if r.Sets[name] == nil {
			t.Errorf("set %s (%s) used by a cluster policy is gone", name, r.Sources[name])
		}
	}
	if r.Sets[podSet("pods-huge", v4)] != nil {
		t.Error("the skipped policy's set is rendered")
	}
}

// TestTierRenderErrors: what the renderer cannot judge correctly is a render error, reported
// again by the next render: an action it does not know, a group dispatched in a direction its
// policies do not judge.
func TestTierRenderErrors(t *testing.T) {
	for what, c := range map[string]struct {
		edit func(*policy.Ruleset)
		want string
	}{
		"unknown action": {func(rs *policy.Ruleset) { rs.ClusterPolicies["admin/ingress/first"].Rules[0].Action = "allow" }, `unknown action "allow"`},
		"group direction": {func(rs *policy.Ruleset) {
			g := rs.Admin.Groups["admin-ingress-1"]
			g.Direction = policy.Egress
			rs.Admin.Groups["admin-ingress-1"] = g
		}, `dispatched for ingress`},
		"policy direction": {func(rs *policy.Ruleset) {
			g := rs.Baseline.Groups["baseline-egress-1"]
			g.Policies = append(g.Policies, "baseline/ingress/fourth")
			rs.Baseline.Groups["baseline-egress-1"] = g
		}, `a policy of the baseline tier for ingress`},
		"policy tier": {func(rs *policy.Ruleset) {
			g := rs.Admin.Groups["admin-ingress-1"]
			g.Policies = append(g.Policies, "baseline/ingress/fourth")
			rs.Admin.Groups["admin-ingress-1"] = g
		}, `a policy of the baseline tier`},
		"both directions": {func(rs *policy.Ruleset) {
			rs.Admin.Dispatch[policy.Egress][netip.MustParseAddr("10.0.0.7")] = "admin-ingress-1"
		}, `dispatched for both`},
	} {
		rs := tierRuleset()
		c.edit(rs)
		var rd Renderer
		for range 2 {
			if r := rd.Render(rs); r.Err() == nil || !strings.Contains(r.Err().Error(), c.want) {
				t.Fatalf("%s: render error %v, want %q", what, r.Err(), c.want)
			}
		}
	}
}

// TestTierNames: the tiers' chain names fit the limit, stay under ChainPrefix (cleanup finds
// them by it) and are dispatch chains exactly where the deferral must treat them as such.
func TestTierNames(t *testing.T) {
	long := "admin-ingress-" + strings.Repeat("x", 300)
	for name, dispatch := range map[string]bool{
		adminChain(long): false, baselineChain(long): false, chainAdminEgress: true, chainAdminIngress: true,
		dispatchChain("AE6", netip.MustParsePrefix("fd00::/124")): true, dispatchChain("AI4", netip.MustParsePrefix("10.0.0.0/28")): true,
	} {
		if len(name) > maxChainName || !strings.HasPrefix(name, ChainPrefix) {
			t.Errorf("chain %s: %d characters, or not under %s", name, len(name), ChainPrefix)
		}
		if isDispatchChain(name) != dispatch {
			t.Errorf("isDispatchChain(%s) = %v", name, !dispatch)
		}
	}
	if adminChain("g") == baselineChain("g") || adminChain("g") == groupChain("g") {
		t.Error("the tiers' group chains collide with each other or with NetworkPolicy groups")
	}
}

// TestDeferredAdminTree: removals from the Admin tree, whose chains end in a goto to the
// NetworkPolicy stage, are shadowed by that goto rather than a RETURN.
func TestDeferredAdminTree(t *testing.T) {
	old := []string{"-d 10.0.0.0/28 -g NETWARDEN-AI4-x", "-d 10.0.0.17/32 -g NETWARDEN-A-g1", "-g " + chainIngress}
	want := []string{"-d 10.0.0.0/28 -g NETWARDEN-AI4-x", "-d 10.0.0.33/32 -g NETWARDEN-A-g2", "-g " + chainIngress}
	got := shadowMerge(old, want)
	exp := []string{"-d 10.0.0.0/28 -g NETWARDEN-AI4-x", "-d 10.0.0.17/32 -g " + chainIngress, "-d 10.0.0.17/32 -g NETWARDEN-A-g1",
		"-d 10.0.0.33/32 -g NETWARDEN-A-g2", "-g " + chainIngress}
	if !slices.Equal(got, exp) {
		t.Errorf("got %q\nwant %q", got, exp)
	}
	// A chain whose continuation changes is not merged.
	if got := shadowMerge(old, want[:2]); !slices.Equal(got, want[:2]) {
		t.Errorf("continuation dropped: got %q", got)
	}
}

// compiledTiers compiles ClusterNetworkPolicies of both tiers, with every action and kind of
// peer and port the compiler knows, over a state from stateWithPods (as the nftables backend's
// test does), plus a rule of a protocol the compiler does not know.
func compiledTiers(n int, adminPriority int32) *policy.Ruleset {
	rs, _ := policy.Compile(compiledTiersState(n, adminPriority), "n1")
	return rs
}

// compiledTiersState is the cluster state of compiledTiers.
func compiledTiersState(n int, adminPriority int32) *cluster.State {
	st := stateWithPods(n)
	st.Nodes["n2"] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.2"}, {Type: corev1.NodeInternalIP, Address: "2001:db8::2"}}}}
	all := &metav1.LabelSelector{}
	st.ClusterPolicies["guard"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: adminPriority,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: all},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionPass, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{}}}, // no protocol this agent knows: matches nothing
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &npav1beta1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1beta1.Port{Range: &npav1beta1.PortRange{Start: 5000, End: 6000}}}}}},
			},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: all}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"198.51.100.0/24", "2001:db8:1::/48"}}}},
			}}}
	st.ClusterPolicies["default-deny"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default-deny"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.BaselineTier, Priority: 1,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{PodSelector: *all}},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionPass, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{SCTP: &npav1beta1.ClusterNetworkPolicyProtocolSCTP{}}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{}}},
			},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"192.0.2.0/24"}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: 443}}}}},
			}}}
	// The NetworkPolicy of stateWithPods isolates the pods for ingress and egress; one pod
	// more, outside its selector, is judged by the baseline tier.
	st.Pods.Set("a/other", cluster.PodOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "other"},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.200"}, {IP: "fd00::200"}}}}))
	return st
}

// TestCompiledTiersJudgeAsExplain: what the compiler makes of real ClusterNetworkPolicies,
// rendered and run through the rules packet by packet, decides as Ruleset.Judge (what
// `netwarden explain` reports) and the model do.
func TestCompiledTiersJudgeAsExplain(t *testing.T) {
	rs := compiledTiers(3, 10)
	if len(rs.Admin.Dispatch[policy.Ingress]) == 0 || len(rs.Baseline.Dispatch[policy.Egress]) == 0 {
		t.Fatal("the compiler put no pod in the tiers: the test proves nothing")
	}
	r := Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	addrs := []netip.Addr{}
	for _, s := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.200", "192.0.2.2", "192.0.2.7", "192.0.2.99", "198.51.100.1", "8.8.8.8",
		"fd00::1", "fd00::2", "fd00::200", "2001:db8::2", "2001:db8:1::1", "fd00:1::1"} {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	var fwd []packet
	for _, src := range addrs {
		for _, dst := range addrs {
			if src == dst || src.Is6() != dst.Is6() {
				continue
			}
			for _, proto := range protocols {
				for _, port := range []uint16{80, 443, 5500, 8000, 8001} {
					fwd = append(fwd, packet{src: src, dst: dst, proto: proto, dport: port})
				}
			}
		}
	}
	checkVerdicts(t, "compiled", rs, r, fwd, nil)
}
