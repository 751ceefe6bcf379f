// Package nftables renders a policy.Ruleset into one nftables table and keeps the kernel in step
// with it: a full atomic replace on the first sync, small diffs afterwards, and drift repair.
//
// Layout (table inet netwarden):
//
//	prerouting-egress (hook prerouting, priority filter)  ip saddr vmap @dispatch-out-v4 ...
//	forward-ingress   (hook forward, priority filter)     ip daddr vmap @dispatch-in-v4 ...
//	grp-<dir>-<hash>-v4, -v6  jump to each selecting policy's chain of that family, then drop
//	in/<ns>/<name>-v4, -v6, out/<ns>/<name>-v4, -v6  one policy's allow rules for one IP
//	                  family, each ending in accept
//
// Each base chain judges in three stages: the admin tier of ClusterNetworkPolicy, then
// NetworkPolicy, then the baseline tier (see tiers.go), each a verdict map lookup by pod.
//
// Egress and ingress live at different hooks, so an accept of one never skips the other.
// Per packet, the work is one map lookup per direction plus the rules of the policies that
// select that pod, and only those of the packet's IP family: the dispatch maps are per family,
// so each group and policy is rendered once per family. Within a rule, the protocol and port
// comparisons come before any set lookup; they read only the packet and the rule, while a
// lookup touches the set's memory, so a rule for another port is left without one.
package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/policy"
)

// TableName is the one nftables table netwarden owns for NetworkPolicy.
const TableName = "netwarden"

const (
	chainPreroutingEgress = "prerouting-egress"
	chainForwardIngress   = "forward-ingress"
)

// dispatchMap names the verdict map for a direction and family.
func dispatchMap(dir policy.Direction, v6 bool) string {
	d := "in"
	if dir == policy.Egress {
		d = "out"
	}
	return "dispatch-" + d + famSuffix(v6)
}

func famSuffix(v6 bool) string {
	if v6 {
		return "-v6"
	}
	return "-v4"
}

// set is a named set or verdict map with its elements. Keys and values are in nft syntax;
// a map element's value is its verdict. Elements of sets rendered from large peer sets are
// produced only when needed (a full sync, or a diff against an unrelated version): an
// incremental sync uses the difference from the version it replaced.
type set struct {
	typ      string
	interval bool
	isMap    bool
	comment  string
	count    int

	elems       map[string]string
	materialize func() map[string]string

	// src identifies the value this set was rendered from; base, when set, the value whose
	// rendering this one differs from by added and removed keys.
	src, base      any
	added, removed []string
}

func (s *set) elements() map[string]string {
	if s.elems == nil && s.materialize != nil {
		s.elems = s.materialize()
	}
	return s.elems
}

func newSet(typ, comment string, elems map[string]string) *set {
	return &set{typ: typ, comment: comment, elems: elems, count: len(elems)}
}

type chain struct {
	base    *knftables.Chain // hook, type and priority; nil for a regular chain
	comment string
	rules   []string
	// specs, when set, hold the rules in structured form (group and policy chains), which
	// lets an incremental sync program them over netlink.
	specs []ruleSpec
}

// Rendered is the complete table content in a form that can be diffed by name.
type Rendered struct {
	Sets   map[string]*set
	Chains map[string]*chain
	// Skipped lists the policies left out because nft cannot program them (see checkPolicy).
	Skipped []policy.SkippedPolicy
}

// Stats counts what a Rendered table holds.
type Stats struct{ Chains, Rules, Sets, Elements int }

func (r *Rendered) size() dataplane.Size {
	s := r.Stats()
	return dataplane.Size{Chains: s.Chains, Rules: s.Rules, Sets: s.Sets, Elements: s.Elements}
}

// Stats returns the object counts of r.
func (r *Rendered) Stats() Stats {
	s := Stats{Chains: len(r.Chains), Sets: len(r.Sets)}
	for _, c := range r.Chains {
		s.Rules += len(c.rules)
	}
	for _, st := range r.Sets {
		s.Elements += st.count
	}
	return s
}

var ndTypes = "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } accept"

// Renderer turns Rulesets into table content. It remembers what it rendered for each
// published set and policy value, so unchanged ones cost nothing and come out as the same
// pointer, which lets diff skip them without comparing elements.
type Renderer struct {
	prev, cur renderCache
	// names holds what is derived from each chain name of the model (see chainNames), kept
	// between renders: most names stay, and building them again is most of a render's garbage.
	names map[string]*chainNames
	// log, when set, adds a rate-limited NFLOG statement before every drop the policies make.
	log *dataplane.DropLog
	// counters adds a counter to every rule that ends a policy's judgement (see PolicyCounters).
	counters bool
}

type renderCache struct {
	groups    map[string]renderedGroup
	addrSets  map[*policy.AddrSet][2]*set
	namedSets map[*policy.NamedPortSet][2]*set
	cidrSets  map[*policy.CIDRSet]*set
	policies  map[*policy.PolicyRules][2]*chain

	tierGroups      map[string]renderedGroup
	clusterPolicies map[*policy.ClusterPolicyRules]clusterChains
}

// clusterChains are a ClusterNetworkPolicy direction's chains (IPv4, IPv6) and, with drop
// logging, the chain each Deny rule goes to, which logs and drops.
type clusterChains struct {
	chains [2]*chain
	drops  map[string]*chain
}

// renderedGroup is a group's chains (IPv4, IPv6; nil for a family none of its pods has) with
// the policy chains each jumps to.
type renderedGroup struct {
	jumps  [2][]string
	chains [2]*chain
}

// dispatchElements returns the elements of one family's dispatch map (pod address -> jump to
// its group's chain of that family), and notes in fams which families each group needs.
func (rd *Renderer) dispatchElements(dispatch map[netip.Addr]string, v6 bool, fams map[string][2]bool) map[string]string {
	elems := map[string]string{}
	fam := 0
	if v6 {
		fam = 1
	}
	for ip, grp := range dispatch {
		if ip.Is6() == v6 {
			elems[ip.String()] = "jump " + rd.familyChain(grp, v6)
			f := fams[grp]
			f[fam] = true
			fams[grp] = f
		}
	}
	return elems
}

// renderGroup renders a group's chain for each family some pod of the group has (fams), into
// r, reusing prev when its content is the same. A chain jumps to the group's policy chains
// (already in r) that hold rules of its family, then ends in final. Neither an unused family's
// chain nor a jump to an empty chain judges a packet, but a change that rewrites every group
// (a policy selecting all pods) would rewrite them: in a single-stack cluster, half its work.
func (rd *Renderer) renderGroup(r *Rendered, prev renderedGroup, name string, policies []string, fams [2]bool, final []ruleSpec) renderedGroup {
	var rg renderedGroup
	for fam, v6 := range []bool{false, true} {
		if !fams[fam] {
			continue
		}
		// The jumps are compared with prev's as they are found: an unchanged group, most of
		// them, allocates nothing.
		same, n := prev.chains[fam] != nil, 0
		for _, p := range policies {
			if fc := rd.familyChain(p, v6); hasRules(r, fc) {
				same = same && n < len(prev.jumps[fam]) && prev.jumps[fam][n] == fc
				n++
			}
		}
		if same && n == len(prev.jumps[fam]) {
			rg.jumps[fam], rg.chains[fam] = prev.jumps[fam], prev.chains[fam]
		} else {
			jumps := make([]string, 0, n)
			for _, p := range policies {
				if fc := rd.familyChain(p, v6); hasRules(r, fc) {
					jumps = append(jumps, fc)
				}
			}
			specs := make([]ruleSpec, 0, len(jumps)+len(final))
			for _, j := range jumps {
				specs = append(specs, ruleSpec{jump: j})
			}
			rg.jumps[fam], rg.chains[fam] = jumps, specChain(append(specs, final...))
		}
		r.Chains[rd.familyChain(name, v6)] = rg.chains[fam]
	}
	return rg
}

func hasRules(r *Rendered, chain string) bool {
	c := r.Chains[chain]
	return c != nil && len(c.rules) > 0
}

// chainNames is what the renderer derives from one chain name of the model.
type chainNames struct {
	family  [2]string // the chain of each family (see familyChain)
	checked bool      // err holds checkPolicy's answer
	err     error
}

func (rd *Renderer) namesOf(name string) *chainNames {
	n := rd.names[name]
	if n == nil {
		if rd.names == nil {
			rd.names = map[string]*chainNames{}
		}
		n = &chainNames{family: [2]string{familyChain(name, false), familyChain(name, true)}}
		rd.names[name] = n
	}
	return n
}

// familyChain is familyChain, built once per name.
func (rd *Renderer) familyChain(name string, v6 bool) string {
	if v6 {
		return rd.namesOf(name).family[1]
	}
	return rd.namesOf(name).family[0]
}

// checkPolicy is checkPolicy, answered once per name (its answer depends on nothing else).
func (rd *Renderer) checkPolicy(chain string, pr *policy.PolicyRules) error {
	n := rd.namesOf(chain)
	if !n.checked {
		n.checked, n.err = true, checkPolicy(chain, pr)
	}
	return n.err
}

// pruneNames forgets the names of chains gone, once they are most of what is kept.
func (rd *Renderer) pruneNames(r *Rendered) {
	if len(rd.names) > 2*len(r.Chains)+1024 {
		rd.names = nil
	}
}

// recycle empties c for reuse: its maps keep their room, so that filling them again neither
// rehashes nor allocates. A cache never filled is made sized like other.
func (c renderCache) recycle(other renderCache) renderCache {
	if c.groups == nil {
		return newRenderCache(other)
	}
	clear(c.groups)
	clear(c.addrSets)
	clear(c.namedSets)
	clear(c.cidrSets)
	clear(c.policies)
	clear(c.tierGroups)
	clear(c.clusterPolicies)
	return c
}

// newRenderCache returns an empty cache sized like prev, so that filling it does not rehash.
func newRenderCache(prev renderCache) renderCache {
	return renderCache{
		groups:    make(map[string]renderedGroup, len(prev.groups)),
		addrSets:  make(map[*policy.AddrSet][2]*set, len(prev.addrSets)),
		namedSets: make(map[*policy.NamedPortSet][2]*set, len(prev.namedSets)),
		cidrSets:  make(map[*policy.CIDRSet]*set, len(prev.cidrSets)),
		policies:  make(map[*policy.PolicyRules][2]*chain, len(prev.policies)),

		tierGroups:      make(map[string]renderedGroup, len(prev.tierGroups)),
		clusterPolicies: make(map[*policy.ClusterPolicyRules]clusterChains, len(prev.clusterPolicies)),
	}
}

// Render turns a Ruleset into table content with a fresh Renderer.
func Render(rs *policy.Ruleset) *Rendered { return (&Renderer{}).Render(rs) }

// Render turns a Ruleset into table content.
func (rd *Renderer) Render(rs *policy.Ruleset) *Rendered {
	// The cache of the render before the last is reused: nothing reads it any more.
	rd.prev, rd.cur = rd.cur, rd.prev.recycle(rd.cur)
	rs, skipped := policy.FailClosed(rs, rd.checkPolicy)
	r := &Rendered{
		Skipped: skipped,
		Sets:    make(map[string]*set, 4+2*len(rs.AddrSets)+len(rs.CIDRSets)+2*len(rs.NamedPortSets)),
		Chains:  make(map[string]*chain, 2+2*len(rs.Groups)+2*len(rs.Policies)),
	}
	groupFams := make(map[string][2]bool, len(rs.Groups))

	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			typ := "ipv4_addr : verdict"
			if v6 {
				typ = "ipv6_addr : verdict"
			}
			elems := rd.dispatchElements(rs.Dispatch[dir], v6, groupFams)
			m := newSet(typ, fmt.Sprintf("local pods isolated for %s -> the group judging them", dir), elems)
			m.isMap = true
			r.Sets[dispatchMap(dir, v6)] = m
		}
	}

	prelude := []ruleSpec{{established: true}, {neighborDiscovery: true}}
	// Egress is judged where every packet from a pod enters the node, whether it is then
	// forwarded or delivered to the node itself; after DNAT (priority dstnat), so a Service
	// address is already its endpoint. Ingress is judged on the way to a pod.
	egress := specChain(append(prelude[:2:2], stages(policy.Egress)...))
	egress.base = baseChain(chainPreroutingEgress, knftables.PreroutingHook, "filter")
	r.Chains[chainPreroutingEgress] = egress
	ingress := specChain(append(prelude[:2:2], stages(policy.Ingress)...))
	ingress.base = baseChain(chainForwardIngress, knftables.ForwardHook, "filter")
	r.Chains[chainForwardIngress] = ingress

	rd.renderTiers(rs, r)
	for name, p := range rs.Policies {
		pair, ok := rd.prev.policies[p]
		if !ok {
			pair = policyChains(p, rd.counters)
		}
		rd.cur.policies[p] = pair
		r.Chains[rd.familyChain(name, false)], r.Chains[rd.familyChain(name, true)] = pair[0], pair[1]
	}
	// An isolated pod that no rule admits is dropped at the end of its group, after the
	// drop is logged (--log-drops) under the group's ID, which is why each group then has an
	// end of its own.
	isolationDrop := []ruleSpec{{drop: true, counter: rd.counters}}
	for name, g := range rs.Groups {
		final := isolationDrop
		if rd.log != nil {
			final = []ruleSpec{logSpec(rd.log, policy.GroupDropID(name)), isolationDrop[0]}
		}
		rd.cur.groups[name] = rd.renderGroup(r, rd.prev.groups[name], name, g.Policies, groupFams[name], final)
	}

	for name, as := range rs.AddrSets {
		pair, ok := rd.prev.addrSets[as]
		if !ok {
			base, hasBase := rd.prev.addrSets[as.Prev]
			pair = renderPair([2]string{"ipv4_addr", "ipv6_addr"}, "pod peers", as, as.Prev, hasBase, base,
				as.Addrs, as.Added, as.Removed, netip.Addr.Is6, netip.Addr.String)
		}
		rd.cur.addrSets[as] = pair
		r.Sets[name+"-v4"], r.Sets[name+"-v6"] = pair[0], pair[1]
	}
	for name, cs := range rs.CIDRSets {
		s, ok := rd.prev.cidrSets[cs]
		if !ok {
			elems := map[string]string{}
			for _, p := range cs.Prefixes {
				elems[prefixElement(p)] = ""
			}
			typ := "ipv4_addr"
			if cs.IPv6 {
				typ = "ipv6_addr"
			}
			s = newSet(typ, "ipBlock", elems)
			s.interval = true
		}
		rd.cur.cidrSets[cs] = s
		r.Sets[name] = s
	}
	for name, ns := range rs.NamedPortSets {
		pair, ok := rd.prev.namedSets[ns]
		if !ok {
			base, hasBase := rd.prev.namedSets[ns.Prev]
			pair = renderPair([2]string{"ipv4_addr . inet_service", "ipv6_addr . inet_service"}, "named port", ns, ns.Prev, hasBase, base,
				ns.Entries, ns.Added, ns.Removed, func(e netip.AddrPort) bool { return e.Addr().Is6() },
				func(e netip.AddrPort) string { return e.Addr().String() + " . " + strconv.Itoa(int(e.Port())) })
		}
		rd.cur.namedSets[ns] = pair
		r.Sets[name+"-v4"], r.Sets[name+"-v6"] = pair[0], pair[1]
	}
	rd.pruneNames(r)
	return r
}

// maxName is the longest name the kernel takes for a chain or set: NFT_NAME_MAXLEN (256)
// counts the terminating zero.
const maxName = 255

// checkPolicy reports why nft cannot program a policy's chains: a name that the kernel does not
// take or nft does not parse (a full sync sends the text to nft). The names come from the
// namespace and name of the policy, which the API limits far less.
func checkPolicy(chain string, _ *policy.PolicyRules) error {
	name := familyChain(chain, true)
	if len(name) > maxName {
		return fmt.Errorf("chain name %s is %d bytes, more than the kernel's %d", name, len(name), maxName)
	}
	for i, c := range []byte(name) {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if i == 0 && !letter && c != '_' && c != '.' ||
			!letter && (c < '0' || c > '9') && !strings.ContainsRune("/-_.", rune(c)) {
			return fmt.Errorf("chain name %s holds %q, which nft does not parse in a name", name, c)
		}
	}
	return nil
}

// renderPair renders one family-mixed peer set as an IPv4 and an IPv6 set. When the value
// it replaced was rendered last time (base), only the difference is formatted; the full
// element lists are produced lazily.
func renderPair[T any, P comparable](types [2]string, comment string, src any, prev P, hasBase bool, base [2]*set,
	all, added, removed []T, is6 func(T) bool, format func(T) string) [2]*set {
	var prevCount [2]int
	if hasBase {
		prevCount = [2]int{base[0].count, base[1].count}
	}
	views := policy.SplitByFamily(all, added, removed, hasBase, prevCount, is6, format)
	var pair [2]*set
	for fam, v := range views {
		s := &set{typ: types[fam], comment: comment, src: src, count: v.Count}
		s.materialize = func() map[string]string {
			m := map[string]string{}
			for _, e := range v.Members() {
				m[e] = ""
			}
			return m
		}
		if hasBase {
			s.base = any(prev)
			s.added, s.removed = v.Added, v.Removed
		}
		pair[fam] = s
	}
	return pair
}

func prefixElement(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func baseChain(name string, hook knftables.BaseChainHook, prio string) *knftables.Chain {
	return &knftables.Chain{
		Name:     name,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(hook),
		Priority: knftables.PtrTo(knftables.BaseChainPriority(prio)),
	}
}

// ruleSpec is a rule of a group or policy chain in structured form. Its text (what nft
// parses on a full sync) and its netlink expressions (what an incremental sync sends) are both
// derived from it, so the two paths always program the same rule.
type ruleSpec struct {
	v6       bool   // family of the address matches
	peerAddr string // "saddr" or "daddr" when the rule matches a peer set
	peerSet  string
	proto    policy.Protocol // "" matches every protocol
	ports    policy.PortRange
	namedSet string // destination address . port lookup
	jump     string // verdict: jump to this chain; else goto gotoTo; else drop when drop, else accept
	gotoTo   string
	drop     bool
	// log, when set, makes a rule with no verdict: for the first packet of a connection, within
	// the rate limit, send the packet to NFLOG with logPrefix.
	log       *dataplane.DropLog
	logPrefix string
	// counter counts the packets the rule matches, just before its verdict.
	counter bool

	// The rules of the base and pass chains, each its own kind:
	// vmap makes "ip|ip6 <peerAddr> vmap @<vmap>": the verdict map decides.
	vmap string
	// established makes "ct state established,related accept".
	established bool
	// neighborDiscovery makes the rule that accepts IPv6 neighbour discovery (ndTypes).
	neighborDiscovery bool
}

// logSpec is the rule logging a drop whose ID is id; the drop follows it. Only packets of
// new connections are logged, so that each denied attempt logs once however long the peer
// retries within it, and the limit is in the kernel, so that a flood is cut where it arises.
func logSpec(l *dataplane.DropLog, id string) ruleSpec { return ruleSpec{log: l, logPrefix: id} }

// dropChain names the chain that logs and drops for one ClusterNetworkPolicy Deny rule.
func dropChain(id string) string { return "drop-" + strings.TrimPrefix(id, policy.DropIDPrefix) }

func (r ruleSpec) text() string {
	switch {
	case r.vmap != "":
		return fmt.Sprintf("%s %s vmap @%s", ipKeyword(r.v6), r.peerAddr, r.vmap)
	case r.established:
		return "ct state established,related accept"
	case r.neighborDiscovery:
		return ndTypes
	}
	var parts []string
	if r.proto != "" {
		parts = append(parts, "meta l4proto "+string(r.proto))
		if r.namedSet == "" && r.ports.Last != 0 {
			parts = append(parts, "th dport "+portRange(r.ports))
		}
	}
	if r.peerSet != "" {
		parts = append(parts, fmt.Sprintf("%s %s @%s", ipKeyword(r.v6), r.peerAddr, r.peerSet))
	}
	if r.namedSet != "" {
		parts = append(parts, fmt.Sprintf("%s daddr . th dport @%s", ipKeyword(r.v6), r.namedSet))
	}
	if r.counter {
		parts = append(parts, "counter")
	}
	switch {
	case r.log != nil:
		parts = append(parts, fmt.Sprintf("ct state new limit rate %d/second burst %d packets log prefix %q group %d",
			r.log.Rate, r.log.Burst, r.logPrefix, r.log.Group))
	case r.jump != "":
		parts = append(parts, "jump "+r.jump)
	case r.gotoTo != "":
		parts = append(parts, "goto "+r.gotoTo)
	case r.drop:
		parts = append(parts, "drop")
	default:
		parts = append(parts, "accept")
	}
	return strings.Join(parts, " ")
}

// specChain builds a chain from its rules in structured form. Group and policy chains carry
// no comment (their names say what they are): an incremental sync creates them over netlink,
// which writes chain comments only through nftnl.Comments, and both paths must leave
// identical tables.
func specChain(specs []ruleSpec) *chain {
	c := &chain{specs: specs, rules: make([]string, len(specs))}
	for i, sp := range specs {
		c.rules[i] = sp.text()
	}
	return c
}

// familyChain names the chain that renders a group or policy of the model for one IP family:
// grp-ingress-<hash>-v4, in/<ns>/<name>-v6. The suffix is always added, so two names of the
// model never map to one chain.
func familyChain(name string, v6 bool) string { return name + famSuffix(v6) }

// policyChains renders a policy's rules as its IPv4 and its IPv6 chain.
func policyChains(p *policy.PolicyRules, counters bool) [2]*chain {
	var specs [2][]ruleSpec
	for _, sp := range policyRules(p, counters) {
		fam := 0
		if sp.v6 {
			fam = 1
		}
		specs[fam] = append(specs[fam], sp)
	}
	return [2]*chain{specChain(specs[0]), specChain(specs[1])}
}

// policyRules expands each policy rule into nft rules: one per peer, port range and IP family.
// Any one of them accepting means the policy allows.
func policyRules(p *policy.PolicyRules, counters bool) []ruleSpec {
	var out []ruleSpec
	for _, rule := range p.Rules {
		out = expandRule(out, p.Direction, rule.Peers, rule.Ports, ruleSpec{counter: counters})
	}
	return out
}

// expandRule appends the nft rules of one model rule (see policy.Matches), each ending in
// verdict's verdict.
func expandRule(out []ruleSpec, dir policy.Direction, peers []policy.Peer, ports []policy.PortMatch, verdict ruleSpec) []ruleSpec {
	peerAddr := "saddr"
	if dir == policy.Egress {
		peerAddr = "daddr"
	}
	for m := range policy.Matches(peers, ports) {
		sp := verdict
		sp.v6, sp.proto, sp.ports = m.IPv6, m.Port.Protocol, m.Range
		switch {
		case m.Peer.AddrSet != "":
			sp.peerAddr, sp.peerSet = peerAddr, m.Peer.AddrSet+famSuffix(m.IPv6)
		case m.Peer.CIDRSet != "":
			sp.peerAddr, sp.peerSet = peerAddr, m.Peer.CIDRSet
		}
		if m.Port.NamedPortSet != "" {
			sp.namedSet = m.Port.NamedPortSet + famSuffix(m.IPv6)
		}
		out = append(out, sp)
	}
	return out
}

func ipKeyword(v6 bool) string {
	if v6 {
		return "ip6"
	}
	return "ip"
}

func portRange(r policy.PortRange) string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}
