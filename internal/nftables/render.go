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
		s.Elements += st.Count()
	}
	return s
}

// Renderer turns Rulesets into table content. It remembers what it rendered for each
// published set and policy value, so unchanged ones cost nothing and come out as the same
// pointer, which lets diff skip them without comparing elements.
type Renderer struct {
	prev, cur renderCache
	// names holds what is derived from each chain name of the model (see chainNames), kept
	// between renders: most names stay, and building them again is most of a render's garbage.
	names map[string]*chainNames
	// log, when set, adds a rate-limited NFLOG statement before every drop the policies make.
	log *policy.DropLog
	// counters adds a counter to every rule that ends a policy's judgement (see PolicyCounters).
	counters bool
	// stagedLog, when set, logs the differences the judgement of staged policies finds.
	stagedLog *policy.DropLog
	// staged is whether the last render had staged policies, whose drops are rendered
	// differently (see dropVerdict).
	staged bool
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

// anew returns a Renderer with rd's settings, changed by set, and nothing rendered: a change of
// settings renders every chain anew.
func (rd *Renderer) anew(set func(*Renderer)) Renderer {
	fresh := Renderer{log: rd.log, counters: rd.counters, stagedLog: rd.stagedLog}
	set(&fresh)
	return fresh
}

// Render turns a Ruleset into table content with a fresh Renderer.
func Render(rs *policy.Ruleset) *Rendered { return (&Renderer{}).Render(rs) }

// Render turns a Ruleset into table content.
func (rd *Renderer) Render(rs *policy.Ruleset) *Rendered {
	// The cache of the render before the last is reused: nothing reads it any more.
	rd.prev, rd.cur = rd.cur, rd.prev.recycle(rd.cur)
	rs, skipped := policy.FailClosed(rs, rd.checkPolicy)
	if staged := rs.Staged != nil; staged != rd.staged {
		// Every drop is rendered anew: nothing rendered last time may be reused.
		rd.prev, rd.staged = newRenderCache(rd.cur), staged
	}
	r := &Rendered{
		Skipped: skipped,
		Sets:    make(map[string]*set, 4+2*len(rs.AddrSets)+len(rs.CIDRSets)+2*len(rs.NamedPortSets)),
		Chains:  make(map[string]*chain, 2+2*len(rs.Groups)+2*len(rs.Policies)),
	}
	groupFams := make(map[string][2]bool, len(rs.Groups))

	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			r.Sets[dispatchMap(dir, v6)] = rd.verdictMap(rs.Dispatch[dir], v6, groupFams,
				fmt.Sprintf("local pods isolated for %s -> the group judging them", dir))
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
	isolationDrop := map[policy.Direction]ruleSpec{}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		sp := dropVerdict(rd.staged, dir)
		sp.counter = rd.counters
		isolationDrop[dir] = sp
	}
	for name, g := range rs.Groups {
		final := []ruleSpec{isolationDrop[g.Direction]}
		if rd.log != nil {
			final = []ruleSpec{logSpec(rd.log, policy.GroupDropID(name)), final[0]}
		}
		rd.cur.groups[name] = rd.renderGroup(r, rd.prev.groups[name], name, g.Policies, groupFams[name], final)
	}
	rd.renderStaged(rs, r)
	rd.renderSets(r, rs)
	rd.pruneNames(r)
	return r
}

func baseChain(name string, hook knftables.BaseChainHook, prio string) *knftables.Chain {
	return &knftables.Chain{
		Name:     name,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(hook),
		Priority: knftables.PtrTo(knftables.BaseChainPriority(prio)),
	}
}
