// Package iptables renders a policy.Ruleset into ipsets and our own chains in the mangle table
// of iptables and ip6tables, and keeps the kernel in step with it, for hosts where nftables
// cannot be used. It enforces exactly the semantics of the nftables backend.
//
// Layout (mangle table, each family; see Table for why mangle):
//
//	FORWARD -> NETWARDEN-FORWARD   established/related and IPv6 ND return; then egress, then ingress
//	INPUT   -> NETWARDEN-INPUT     established/related and IPv6 ND return; then egress (pod -> node)
//	NETWARDEN-EGRESS   -s <isolated local pod IP> -g <its group chain>, or -s <subprefix> -g NETWARDEN-E4-<hash>
//	NETWARDEN-INGRESS  -d <isolated local pod IP> -g <its group chain>, or -d <subprefix> -g NETWARDEN-I4-<hash>
//	NETWARDEN-E4/E6/I4/I6-<hash>  the same for the pods of one block of 16 addresses
//	NETWARDEN-G-<hash> the rules of the group's policies, each ending in RETURN; then DROP
//
// With ClusterNetworkPolicy tiers, per direction (egress shown; ingress is the same with -d):
//
//	NETWARDEN-FORWARD/INPUT  -j NETWARDEN-ADMIN-EGRESS instead of -j NETWARDEN-EGRESS, in a
//	                   family where some local pod is a subject of the Admin tier
//	NETWARDEN-ADMIN-EGRESS  -s <pod IP> -g NETWARDEN-A-<hash>, or -s <subprefix> -g
//	                   NETWARDEN-AE4-<hash> (whose rules end likewise); then -g NETWARDEN-EGRESS
//	NETWARDEN-A-<hash> an Admin group: its policies' rules in the group's order, Accept -j RETURN,
//	                   Deny -j DROP, Pass -g NETWARDEN-EGRESS; then -g NETWARDEN-EGRESS
//	NETWARDEN-EGRESS   the tree above leads each pod isolated by NetworkPolicy to its
//	                   NETWARDEN-G- chain, and each other pod that is a subject of the Baseline
//	                   tier to its NETWARDEN-B- chain; any other address falls through (allowed)
//	NETWARDEN-B-<hash> a Baseline group: its policies' rules in the group's order, Deny -j DROP,
//	                   Accept and Pass -j RETURN; falling off the end allows
//
// Everything below NETWARDEN-EGRESS/-INGRESS (or the Admin root) is entered by -g, so a RETURN
// anywhere, or falling off the end of any of those chains, ends the judgement of that direction
// as allowed and returns to NETWARDEN-FORWARD (which goes on to the other direction) or
// NETWARDEN-INPUT; a DROP ends
// the packet. So an Admin Accept skips NetworkPolicy and the Baseline tier of its direction
// only, and an Admin Pass (or no Admin rule matching) continues with the NetworkPolicy stage by
// goto. A pod isolated by NetworkPolicy is never led to the Baseline tier, which is how the
// Baseline tier is judged only for pods that NetworkPolicy leaves alone. When a Ruleset has no
// tiers the layout is exactly the first one.
//
// Dispatch is a tree of address compares rather than a rule per group with an ipset lookup:
// both are bounded by the node's pods, but a compare costs far less than a set lookup, and the
// two-level tree crosses a few dozen of them per direction at most.
//
// An allowed packet returns to the built-in chain rather than being accepted, as an accept in
// the nftables table leaves other tables to judge it too: egress allowed still meets ingress,
// and rules other components keep after our jump still see the packet. iptables has no way for
// a nested chain to end its caller's evaluation, so a group chain holds its policies' rules
// itself rather than jumping to a chain per policy; the per-packet work is still the rules of
// exactly the policies that select the pod. Traffic from the node to its pods leaves through
// OUTPUT and never meets these chains.
package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/xtables"
)

// Chain and set names. Every chain we own starts with ChainPrefix and every set with
// SetPrefix, which is how cleanup and a restarted agent find what an earlier run left.
const (
	ChainPrefix = "NETWARDEN-"
	SetPrefix   = "netwarden-"

	chainForward = ChainPrefix + "FORWARD"
	chainInput   = ChainPrefix + "INPUT"
	chainEgress  = ChainPrefix + "EGRESS"
	chainIngress = ChainPrefix + "INGRESS"
	groupPrefix  = ChainPrefix + "G-"

	// The ClusterNetworkPolicy tiers: the Admin tier's dispatch roots, and its and the
	// Baseline tier's group chains.
	chainAdminEgress    = ChainPrefix + "ADMIN-EGRESS"
	chainAdminIngress   = ChainPrefix + "ADMIN-INGRESS"
	adminGroupPrefix    = ChainPrefix + "A-"
	baselineGroupPrefix = ChainPrefix + "B-"

	// swapSet is the temporary set a full sync fills and swaps with a live one, so a set is
	// never seen empty or half-filled.
	swapSet = SetPrefix + "swap"

	maxChainName = 28
	maxSetName   = 31
	hashLen      = 16 // base32 characters: 80 bits
)

// Table is where our chains live: mangle, not filter. Every table is a separate base chain on
// the same hook, and an ACCEPT ends only the table it is in; the mangle table's FORWARD and
// INPUT (priority -150) run before the filter table's (0) for every packet. kube-proxy's
// iptables mode puts `-j KUBE-FORWARD` first in filter FORWARD, whenever it (re)starts, and
// KUBE-FORWARD accepts the packets carrying its masquerade mark (NodePort and hairpin
// traffic); Docker, firewalld's iptables backend and other CNIs accept in filter too. In
// filter, whoever inserted last would decide whether our chains see those packets at all; in
// mangle no accept of theirs can come first, and every packet is judged by our rules after
// DNAT (prerouting) and before SNAT (postrouting), as in filter. Within mangle, Verify
// requires our jumps ahead of every other component's rules, and the agent repairs any change
// there at once (see kernelwatch).
const Table = "mangle"

// oldTable is where releases before the move to mangle kept the chains: a full sync and
// cleanup remove what such a run left there.
const oldTable = "filter"

// hookJumps are the jumps from built-in chains into ours.
var hookJumps = []struct{ builtin, chain string }{
	{"FORWARD", chainForward},
	{"INPUT", chainInput},
}

const (
	v4 = 0
	v6 = 1
)

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:])[:hashLen]
}

func famDigit(fam int) string {
	if fam == v6 {
		return "6"
	}
	return "4"
}

// Names derived from Ruleset names: the kind and family are spelled out, the Ruleset name is
// hashed, so names are deterministic and short whatever the namespace and policy names.
func groupChain(group string) string     { return groupPrefix + hashOf(group) }
func adminChain(group string) string     { return adminGroupPrefix + hashOf(group) }
func baselineChain(group string) string  { return baselineGroupPrefix + hashOf(group) }
func podSet(name string, fam int) string { return SetPrefix + "p" + famDigit(fam) + "-" + hashOf(name) }
func cidrSet(name string, fam int) string {
	return SetPrefix + "c" + famDigit(fam) + "-" + hashOf(name)
}
func portSet(name string, fam int) string {
	return SetPrefix + "n" + famDigit(fam) + "-" + hashOf(name)
}

// ipset is one kernel set with its members in `ipset save` syntax. Members of large peer sets
// are produced only when needed; an incremental sync uses the difference from the version it
// replaced.
type ipset struct {
	typ   string // hash:ip, hash:net or hash:ip,port
	v6    bool
	count int

	members     map[string]bool
	materialize func() map[string]bool

	// src identifies the value this set was rendered from; base, when set, the value whose
	// rendering this one differs from by added and removed members.
	src, base      any
	added, removed []string
}

func (s *ipset) elements() map[string]bool {
	if s.members == nil {
		if s.materialize != nil {
			s.members = s.materialize()
		} else {
			s.members = map[string]bool{}
		}
	}
	return s.members
}

func (s *ipset) createLine(name string) string {
	fam := "inet"
	if s.v6 {
		fam = "inet6"
	}
	// Sized for about four members a bucket: most sets are small, and ipset grows a set's
	// table itself when members are added later.
	hashsize := 64
	for hashsize < 65536 && hashsize*4 < s.count {
		hashsize *= 2
	}
	// An ipBlock's set never changes (its name stands for its content), so it is made as
	// large as it needs: some ten thousand excepts cut a /0 into more than a million prefixes.
	maxelem := maxSetElements
	if s.typ == "hash:net" {
		maxelem = max(maxelem, s.count)
	}
	return fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d", name, s.typ, fam, hashsize, maxelem)
}

// maxSetElements is the maxelem of every set of pods: ipset refuses a member beyond it ("Hash
// is full"), and a set's limit cannot change once the rules reference it.
const maxSetElements = 1 << 20

// policyChecker returns the check of policy.FailClosed for rs: a policy whose pod or
// named-port sets need more members than such a set may hold cannot be expressed. That takes
// a million pods.
func policyChecker(rs *policy.Ruleset) func(string, *policy.PolicyRules) error {
	tooMany := func(kind, name string, n int) error {
		return fmt.Errorf("its %s %s needs %d members in one ipset, more than the %d a set holds", kind, name, n, maxSetElements)
	}
	return func(_ string, pr *policy.PolicyRules) error {
		for _, r := range pr.Rules {
			for _, p := range r.Peers {
				if p.AddrSet == "" {
					continue
				}
				if n := largestFamily(rs.AddrSets[p.AddrSet].Addrs, netip.Addr.Is6); n > maxSetElements {
					return tooMany("peer set", p.AddrSet, n)
				}
			}
			for _, pm := range r.Ports {
				if pm.NamedPortSet == "" {
					continue
				}
				is6 := func(e netip.AddrPort) bool { return e.Addr().Is6() }
				if n := largestFamily(rs.NamedPortSets[pm.NamedPortSet].Entries, is6); n > maxSetElements {
					return tooMany("named port set", pm.NamedPortSet, n)
				}
			}
		}
		return nil
	}
}

// largestFamily returns how many members the larger family's set of all needs. The sets are
// counted only when both together could be too many.
func largestFamily[T any](all []T, is6 func(T) bool) int {
	if len(all) <= maxSetElements {
		return len(all)
	}
	n6 := 0
	for _, v := range all {
		if is6(v) {
			n6++
		}
	}
	return max(n6, len(all)-n6)
}

// Rendered is what the kernel should hold: sets by name, and per family (v4, v6) our chains
// by name, each a list of rule specifications as iptables-save prints them after "-A NAME ".
type Rendered struct {
	Sets   map[string]*ipset
	Chains [2]map[string][]string
	// Sources maps every hashed kernel name to the Ruleset name it stands for, for render
	// output and for the collision check.
	Sources map[string]string
	// GroupPolicies lists, per group chain, the policies whose rules it holds.
	GroupPolicies map[string][]string
	// Skipped lists the policies left out because they cannot be expressed (see
	// policyChecker).
	Skipped []policy.SkippedPolicy
	err     error
}

func (r *Rendered) size() dataplane.Size {
	s := dataplane.Size{Sets: len(r.Sets)}
	for fam := range r.Chains {
		s.Chains += len(r.Chains[fam])
		for _, rules := range r.Chains[fam] {
			s.Rules += len(rules)
		}
	}
	for _, st := range r.Sets {
		s.Elements += st.count
	}
	return s
}

// Stats returns the object counts of r.
func (r *Rendered) Stats() dataplane.Size { return r.size() }

// name records that kernel name k stands for Ruleset name src and returns k. Two Ruleset
// names hashing to the same kernel name would merge two objects; Render reports it instead.
func (r *Rendered) name(k, src string) string {
	if prev, ok := r.Sources[k]; ok && prev != src && r.err == nil {
		r.err = fmt.Errorf("iptables names collide: %q and %q both map to %s", prev, src, k)
	}
	r.Sources[k] = src
	return k
}

// Err reports a naming problem that makes r unusable.
func (r *Rendered) Err() error { return r.err }

// Renderer turns Rulesets into kernel content. It remembers what it rendered for each
// published set and policy value, so unchanged ones cost nothing and come out as the same
// pointer, which lets the diff skip them without comparing members.
type Renderer struct {
	prev, cur renderCache
	// log, when set, adds a rate-limited NFLOG rule before every drop the policies make.
	log *dataplane.DropLog
}

type renderCache struct {
	addrSets  map[*policy.AddrSet][2]*ipset
	namedSets map[*policy.NamedPortSet][2]*ipset
	cidrSets  map[*policy.CIDRSet]*ipset
	policies  map[*policy.PolicyRules][2][]string
	cluster   map[*policy.ClusterPolicyRules][2][]string
}

func newRenderCache() renderCache {
	return renderCache{addrSets: map[*policy.AddrSet][2]*ipset{}, namedSets: map[*policy.NamedPortSet][2]*ipset{},
		cidrSets: map[*policy.CIDRSet]*ipset{}, policies: map[*policy.PolicyRules][2][]string{},
		cluster: map[*policy.ClusterPolicyRules][2][]string{}}
}

// Render turns a Ruleset into kernel content with a fresh Renderer.
func Render(rs *policy.Ruleset) *Rendered { return (&Renderer{}).Render(rs) }

var ndTypes = []int{133, 134, 135, 136, 137} // router solicit/advert, neighbor solicit/advert, redirect

// Render turns a Ruleset into kernel content.
func (rd *Renderer) Render(rs *policy.Ruleset) *Rendered {
	rd.prev, rd.cur = rd.cur, newRenderCache()
	if rd.prev.addrSets == nil {
		rd.prev = newRenderCache()
	}
	rs, skipped := failClosed(rs)
	r := &Rendered{Sets: map[string]*ipset{}, Sources: map[string]string{}, GroupPolicies: map[string][]string{}, Skipped: skipped}
	for fam := range r.Chains {
		r.Chains[fam] = map[string][]string{}
	}

	// Which families each group has pods in: a group chain exists only where a dispatch
	// rule leads to it. The Admin tier has a root of its own in each direction and family
	// where it has pods, and the built-in chains jump there instead.
	var used, usedAdmin, usedBaseline = map[string][2]bool{}, map[string][2]bool{}, map[string][2]bool{}
	// The direction each tier group is dispatched in, which its chain must judge.
	tierDirs := map[policy.TierName]map[string]policy.Direction{policy.AdminTier: {}, policy.BaselineTier: {}}
	entry := map[policy.Direction][2]string{}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		kind, flag := "I", "-d"
		if dir == policy.Egress {
			kind, flag = "E", "-s"
		}
		var leaves, admin [2][]dispatchLeaf
		for ip, grp := range rs.Dispatch[dir] {
			fam := famOf(ip)
			leaves[fam] = append(leaves[fam], dispatchLeaf{ip: ip, chain: r.name(groupChain(grp), grp)})
			markUsed(used, grp, fam)
		}
		// The Baseline tier judges only pods that NetworkPolicy does not isolate, so its
		// groups share the NetworkPolicy tree: an address leads to one or the other.
		for ip, grp := range rs.Baseline.Dispatch[dir] {
			if _, isolated := rs.Dispatch[dir][ip]; isolated {
				continue
			}
			fam := famOf(ip)
			leaves[fam] = append(leaves[fam], dispatchLeaf{ip: ip, chain: r.name(baselineChain(grp), "baseline "+grp)})
			markUsed(usedBaseline, grp, fam)
			r.tierDirection(tierDirs[policy.BaselineTier], grp, dir)
		}
		for ip, grp := range rs.Admin.Dispatch[dir] {
			fam := famOf(ip)
			admin[fam] = append(admin[fam], dispatchLeaf{ip: ip, chain: r.name(adminChain(grp), "admin "+grp)})
			markUsed(usedAdmin, grp, fam)
			r.tierDirection(tierDirs[policy.AdminTier], grp, dir)
		}
		var e [2]string
		for fam := range leaves {
			sortLeaves(leaves[fam])
			r.dispatchTree(fam, npRoot(dir), kind+famDigit(fam), flag, leaves[fam], "")
			e[fam] = npRoot(dir)
			if len(admin[fam]) > 0 {
				sortLeaves(admin[fam])
				r.dispatchTree(fam, adminRoot(dir), "A"+kind+famDigit(fam), flag, admin[fam], "-g "+npRoot(dir))
				e[fam] = adminRoot(dir)
			}
		}
		entry[dir] = e
	}
	for fam := range r.Chains {
		prelude := []string{"-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"}
		if fam == v6 {
			for _, t := range ndTypes {
				prelude = append(prelude, fmt.Sprintf("-p ipv6-icmp -m icmp6 --icmpv6-type %d -j RETURN", t))
			}
		}
		// Egress is judged on every packet from a pod, forwarded or delivered to the node;
		// the filter table sees it after DNAT, so a Service address is already its endpoint.
		egress, ingress := entry[policy.Egress][fam], entry[policy.Ingress][fam]
		r.Chains[fam][chainForward] = append(slices.Clip(prelude), "-j "+egress, "-j "+ingress)
		r.Chains[fam][chainInput] = append(slices.Clip(prelude), "-j "+egress)
	}

	for _, name := range slices.Sorted(maps.Keys(rs.Groups)) {
		g := rs.Groups[name]
		for fam := range r.Chains {
			if !used[name][fam] {
				continue // no pod of this family: no chain for it
			}
			chain := groupChain(name)
			var rules []string
			for _, p := range g.Policies {
				pr, ok := rs.Policies[p]
				if !ok {
					continue
				}
				lines, ok := rd.cur.policies[pr]
				if !ok {
					if lines, ok = rd.prev.policies[pr]; !ok {
						lines = policyLines(pr)
					}
					rd.cur.policies[pr] = lines
				}
				rules = append(rules, lines[fam]...)
			}
			if rd.log != nil {
				rules = append(rules, logLine(rd.log, policy.GroupDropID(name)))
			}
			r.Chains[fam][chain] = append(rules, "-j DROP")
			r.GroupPolicies[chain] = g.Policies
		}
	}
	rd.tierGroups(r, rs, policy.AdminTier, usedAdmin, tierDirs[policy.AdminTier])
	rd.tierGroups(r, rs, policy.BaselineTier, usedBaseline, tierDirs[policy.BaselineTier])
	// Policy rules name their sets through the hash of the Ruleset name; record the sources
	// here, where each name is known, so collisions are found.
	for name, as := range rs.AddrSets {
		pair, ok := rd.prev.addrSets[as]
		if !ok {
			base, hasBase := rd.prev.addrSets[as.Prev]
			pair = renderPair("hash:ip", as, as.Prev, hasBase, base, as.Addrs, as.Added, as.Removed,
				netip.Addr.Is6, netip.Addr.String)
		}
		rd.cur.addrSets[as] = pair
		r.Sets[r.name(podSet(name, v4), name)], r.Sets[r.name(podSet(name, v6), name)] = pair[0], pair[1]
	}
	for name, cs := range rs.CIDRSets {
		s, ok := rd.prev.cidrSets[cs]
		if !ok {
			elems := map[string]bool{}
			for _, p := range cs.Prefixes {
				for _, m := range xtables.HashNetPrefixes(p) {
					elems[prefixMember(m)] = true
				}
			}
			s = &ipset{typ: "hash:net", v6: cs.IPv6, count: len(elems), members: elems, src: cs}
		}
		rd.cur.cidrSets[cs] = s
		fam := v4
		if cs.IPv6 {
			fam = v6
		}
		r.Sets[r.name(cidrSet(name, fam), name)] = s
	}
	for name, ns := range rs.NamedPortSets {
		pair, ok := rd.prev.namedSets[ns]
		if !ok {
			base, hasBase := rd.prev.namedSets[ns.Prev]
			proto := namedPortProto(name)
			pair = renderPair("hash:ip,port", ns, ns.Prev, hasBase, base, ns.Entries, ns.Added, ns.Removed,
				func(e netip.AddrPort) bool { return e.Addr().Is6() },
				func(e netip.AddrPort) string {
					return e.Addr().String() + "," + proto + ":" + strconv.Itoa(int(e.Port()))
				})
		}
		rd.cur.namedSets[ns] = pair
		r.Sets[r.name(portSet(name, v4), name)], r.Sets[r.name(portSet(name, v6), name)] = pair[0], pair[1]
	}
	for fam := range r.Chains {
		for name := range r.Chains[fam] {
			if len(name) > maxChainName && r.err == nil {
				r.err = fmt.Errorf("chain name %s longer than %d characters", name, maxChainName)
			}
		}
	}
	for name := range r.Sets {
		if len(name) > maxSetName && r.err == nil {
			r.err = fmt.Errorf("set name %s longer than %d characters", name, maxSetName)
		}
	}
	return r
}

// tierGroups writes the group chains of one ClusterNetworkPolicy tier, for the families its
// dispatch leads to them in: each group's policies' rules in the order the group lists them.
// An Admin group that no rule decides goes on with the NetworkPolicy stage; a Baseline group
// falls off its end, which allows. Rules at the end of a chain that do what its end does
// anyway are left out.
//
// A group, and each policy in it, must be of the tier and the direction the group is
// dispatched in: an Admin group's Pass and end go on with that direction's NetworkPolicy
// stage. Anything else is a render error rather than a packet judged by the wrong direction.
func (rd *Renderer) tierGroups(r *Rendered, rs *policy.Ruleset, tier policy.TierName, used map[string][2]bool, dirs map[string]policy.Direction) {
	t := rs.Tier(tier)
	for _, name := range slices.Sorted(maps.Keys(t.Groups)) {
		g := t.Groups[name]
		dir, dispatched := dirs[name]
		if !dispatched {
			continue // no pod: no chain
		}
		if g.Direction != dir {
			r.fail(fmt.Errorf("%s tier group %s of direction %q is dispatched for %s", tier, name, g.Direction, dir))
		}
		for _, p := range g.Policies {
			if cp, ok := rs.ClusterPolicies[p]; ok && (cp.Tier != tier || cp.Direction != dir) {
				r.fail(fmt.Errorf("%s tier group %s (%s) lists %s, a policy of the %s tier for %s", tier, name, dir, p, cp.Tier, cp.Direction))
			}
		}
		chain, end := baselineChain(name), "-j RETURN"
		if tier == policy.AdminTier {
			chain, end = adminChain(name), "-g "+npRoot(dir)
		}
		var described []string
		for _, p := range g.Policies {
			if cp, ok := rs.ClusterPolicies[p]; ok {
				described = append(described, fmt.Sprintf("%s (%s, priority %d)", p, cp.Source, cp.Priority))
			}
		}
		for fam := range r.Chains {
			if !used[name][fam] {
				continue
			}
			var rules []string
			for _, p := range g.Policies {
				cp, ok := rs.ClusterPolicies[p]
				if !ok {
					continue
				}
				lines, ok := rd.cur.cluster[cp]
				if !ok {
					if lines, ok = rd.prev.cluster[cp]; !ok {
						var err error
						if lines, err = clusterPolicyLines(p, cp, rd.log != nil); err != nil {
							r.fail(err)
							continue // not cached: the next render reports it again
						}
					}
					rd.cur.cluster[cp] = lines
				}
				rules = append(rules, lines[fam]...)
			}
			for len(rules) > 0 && (rules[len(rules)-1] == end || strings.HasSuffix(rules[len(rules)-1], " "+end)) {
				rules = rules[:len(rules)-1]
			}
			if tier == policy.AdminTier {
				rules = append(rules, end)
			}
			if rules == nil {
				rules = []string{}
			}
			r.Chains[fam][chain] = rules
			r.GroupPolicies[chain] = described
			if rd.log != nil {
				rd.dropChains(r, fam, rs, g.Policies)
			}
		}
	}
}

// logLine is the rule logging a drop whose ID is id; the drop follows it. Only packets of new
// connections are logged, so that each denied attempt logs once, and the limit is in the
// kernel, so that a flood is cut where it arises. The spelling is iptables-save's, which
// Verify compares with (it leaves out a burst of 5, xt_limit's default).
func logLine(l *dataplane.DropLog, id string) string {
	burst := ""
	if l.Burst != 5 {
		burst = fmt.Sprintf(" --limit-burst %d", l.Burst)
	}
	return fmt.Sprintf("-m conntrack --ctstate NEW -m limit --limit %d/sec%s -j NFLOG --nflog-prefix %q --nflog-group %d",
		l.Rate, burst, id, l.Group)
}

// dropChain names the chain that logs and drops for one ClusterNetworkPolicy Deny rule.
func dropChain(id string) string { return ChainPrefix + "L-" + hashOf(id) }

// dropChains adds, in family fam, the chains the Deny rules of policies go to with drop
// logging on: each logs with its rule's ID, then drops.
func (rd *Renderer) dropChains(r *Rendered, fam int, rs *policy.Ruleset, policies []string) {
	for _, p := range policies {
		cp, ok := rs.ClusterPolicies[p]
		if !ok {
			continue
		}
		for _, rule := range cp.Rules {
			if rule.Action != policy.Deny {
				continue
			}
			id := policy.ClusterRuleDropID(p, rule.Index)
			chain := r.name(dropChain(id), id)
			if _, done := r.Chains[fam][chain]; !done {
				r.Chains[fam][chain] = []string{logLine(rd.log, id), "-j DROP"}
			}
		}
	}
}

// failClosed applies policy.FailClosed with this backend's check. That leaves out the sets no
// remaining NetworkPolicy uses, which ClusterNetworkPolicies may still need: those are kept.
func failClosed(rs *policy.Ruleset) (*policy.Ruleset, []policy.SkippedPolicy) {
	out, skipped := policy.FailClosed(rs, policyChecker(rs))
	if out == rs || len(rs.ClusterPolicies) == 0 {
		return out, skipped
	}
	for _, cp := range rs.ClusterPolicies {
		for _, rule := range cp.Rules {
			for _, p := range rule.Peers {
				if s, ok := rs.AddrSets[p.AddrSet]; ok && p.AddrSet != "" {
					out.AddrSets[p.AddrSet] = s
				}
				if s, ok := rs.CIDRSets[p.CIDRSet]; ok && p.CIDRSet != "" {
					out.CIDRSets[p.CIDRSet] = s
				}
			}
			for _, pm := range rule.Ports {
				if s, ok := rs.NamedPortSets[pm.NamedPortSet]; ok && pm.NamedPortSet != "" {
					out.NamedPortSets[pm.NamedPortSet] = s
				}
			}
		}
	}
	return out, skipped
}

// dispatchChain names the dispatch chain for a subprefix; kind is E or I and the family digit.
func dispatchChain(kind string, p netip.Prefix) string {
	return ChainPrefix + kind + "-" + hashOf(p.String())[:maxChainName-len(ChainPrefix)-len(kind)-1]
}

type dispatchLeaf struct {
	ip    netip.Addr
	chain string
}

// dispatchTree writes the dispatch chain of one direction and family, a two-level tree: one
// rule per occupied block of 16 addresses ("-s <block> -g <block chain>", or straight to the
// group when the block holds one pod), and in each block chain one rule per pod ("-s IP -g
// group"). A node's pods come from its pod CIDR, so a packet crosses a few dozen cheap address
// compares at most. The blocks are fixed by the addresses, not by which pods exist, so a pod
// added or removed rewrites its block's chain and at most the root. Entries are sorted.
//
// cont, when set, is the rule that ends the root and every block chain: where an address that
// no rule leads to a group goes on (the Admin tree's "-g NETWARDEN-EGRESS"). Without it such
// an address falls off the end, which allows it.
func (r *Rendered) dispatchTree(fam int, root, kind, flag string, leaves []dispatchLeaf, cont string) {
	bits := addrBits(fam)
	rule := func(p netip.Prefix, target string) string { return fmt.Sprintf("%s %s -g %s", flag, p, target) }
	rules := []string{}
	for start := 0; start < len(leaves); {
		block := netip.PrefixFrom(leaves[start].ip, bits-4).Masked()
		end := start + 1
		for end < len(leaves) && block.Contains(leaves[end].ip) {
			end++
		}
		if end-start == 1 {
			rules = append(rules, rule(netip.PrefixFrom(leaves[start].ip, bits), leaves[start].chain))
		} else {
			child := r.name(dispatchChain(kind, block), kind+" "+block.String())
			rules = append(rules, rule(block, child))
			inner := make([]string, 0, end-start+1)
			for _, l := range leaves[start:end] {
				inner = append(inner, rule(netip.PrefixFrom(l.ip, bits), l.chain))
			}
			if cont != "" {
				inner = append(inner, cont)
			}
			r.Chains[fam][child] = inner
		}
		start = end
	}
	if cont != "" {
		rules = append(rules, cont)
	}
	r.Chains[fam][root] = rules
}

func famOf(ip netip.Addr) int {
	if ip.Is6() {
		return v6
	}
	return v4
}

// tierDirection records that a tier group is dispatched in dir; one group in both
// directions is a render error.
func (r *Rendered) tierDirection(dirs map[string]policy.Direction, grp string, dir policy.Direction) {
	if d, ok := dirs[grp]; ok && d != dir {
		r.fail(fmt.Errorf("tier group %s is dispatched for both %s and %s", grp, d, dir))
	}
	dirs[grp] = dir
}

// fail records the first error that makes r unusable.
func (r *Rendered) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func markUsed(used map[string][2]bool, grp string, fam int) {
	u := used[grp]
	u[fam] = true
	used[grp] = u
}

func sortLeaves(leaves []dispatchLeaf) {
	sort.Slice(leaves, func(a, b int) bool { return leaves[a].ip.Less(leaves[b].ip) })
}

// npRoot is the root of a direction's NetworkPolicy and Baseline dispatch: where an Admin
// Pass, and an Admin group that no rule of decides, go on.
func npRoot(dir policy.Direction) string {
	if dir == policy.Egress {
		return chainEgress
	}
	return chainIngress
}

// adminRoot is the root of a direction's Admin tier dispatch.
func adminRoot(dir policy.Direction) string {
	if dir == policy.Egress {
		return chainAdminEgress
	}
	return chainAdminIngress
}

func addrBits(fam int) int {
	if fam == v6 {
		return 128
	}
	return 32
}

// namedPortProto recovers the protocol of a named-port set from its Ruleset name
// ("port-<name>-<proto>"), which ipset needs in every member.
func namedPortProto(name string) string {
	i := strings.LastIndexByte(name, '-')
	return name[i+1:]
}

// renderPair renders one family-mixed peer set as an IPv4 and an IPv6 set. When the value it
// replaced was rendered last time (base), only the difference is formatted; the full member
// lists are produced lazily.
func renderPair[T any, P comparable](typ string, src any, prev P, hasBase bool, base [2]*ipset,
	all, added, removed []T, is6 func(T) bool, format func(T) string) [2]*ipset {
	var prevCount [2]int
	if hasBase {
		prevCount = [2]int{base[0].count, base[1].count}
	}
	views := policy.SplitByFamily(all, added, removed, hasBase, prevCount, is6, format)
	var pair [2]*ipset
	for fam, v := range views {
		s := &ipset{typ: typ, v6: fam == v6, src: src, count: v.Count}
		s.materialize = func() map[string]bool {
			m := map[string]bool{}
			for _, e := range v.Members() {
				m[e] = true
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

// prefixMember spells a prefix as `ipset save` lists it in a hash:net set.
func prefixMember(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

// policyLines expands one policy's rules into iptables rule specifications per family: one per
// peer, port range and family. Any of them matching returns, which allows the packet.
func policyLines(p *policy.PolicyRules) [2][]string {
	var out [2][]string
	for _, rule := range p.Rules {
		appendMatchLines(&out, p.Direction, rule.Peers, rule.Ports, "-j RETURN")
	}
	return out
}

// clusterPolicyLines expands one ClusterNetworkPolicy direction's rules, in order, like
// policyLines; each rule's lines end in its action: Accept returns (this direction is
// allowed), Deny drops (or, with drop logging, goes to the rule's chain that logs and drops,
// so a packet the rule does not match costs what it did), and Pass goes on with the
// NetworkPolicy stage in the Admin tier and returns (allows) in the Baseline tier. chain is
// the policy's key in the Ruleset.
func clusterPolicyLines(chain string, p *policy.ClusterPolicyRules, logDrops bool) ([2][]string, error) {
	var out [2][]string
	for i, rule := range p.Rules {
		var target string
		switch rule.Action {
		case policy.Accept:
			target = "-j RETURN"
		case policy.Deny:
			target = "-j DROP"
			if logDrops {
				target = "-g " + dropChain(policy.ClusterRuleDropID(chain, rule.Index))
			}
		case policy.Pass:
			target = "-j RETURN"
			if p.Tier == policy.AdminTier {
				target = "-g " + npRoot(p.Direction)
			}
		default:
			return out, fmt.Errorf("ClusterNetworkPolicy %s: rule %d has unknown action %q", p.Source, i, rule.Action)
		}
		appendMatchLines(&out, p.Direction, rule.Peers, rule.Ports, target)
	}
	return out, nil
}

// appendMatchLines appends to out the lines of one rule (see policy.Matches), each ending in
// target. iptables and ip6tables are separate, so a line goes to its family's list.
func appendMatchLines(out *[2][]string, dir policy.Direction, peers []policy.Peer, ports []policy.PortMatch, target string) {
	peerDir := "src"
	if dir == policy.Egress {
		peerDir = "dst"
	}
	for m := range policy.Matches(peers, ports) {
		fam := v4
		if m.IPv6 {
			fam = v6
		}
		var parts []string
		if m.Port.Protocol != "" {
			parts = append(parts, "-p "+string(m.Port.Protocol))
		}
		switch {
		case m.Peer.AddrSet != "":
			parts = append(parts, "-m set --match-set "+podSet(m.Peer.AddrSet, fam)+" "+peerDir)
		case m.Peer.CIDRSet != "":
			parts = append(parts, "-m set --match-set "+cidrSet(m.Peer.CIDRSet, fam)+" "+peerDir)
		}
		if m.Port.Protocol != "" {
			switch {
			case m.Port.NamedPortSet != "":
				parts = append(parts, "-m set --match-set "+portSet(m.Port.NamedPortSet, fam)+" dst,dst")
			case !m.AnyPort:
				// An explicit range is always compared, 0-0 too.
				parts = append(parts, "-m "+string(m.Port.Protocol)+" --dport "+portRange(m.Range))
			}
		}
		out[fam] = append(out[fam], strings.Join(append(parts, target), " "))
	}
}

func portRange(r policy.PortRange) string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d:%d", r.First, r.Last)
}
