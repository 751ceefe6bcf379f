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
// With staged policies (policy.Ruleset.Staged), new connections are judged a second time, as
// the staged policies would, after each direction's verdict; see staged.go for those chains.
// Without staged policies not one rule differs.
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
	"fmt"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/policy"
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
		s.Elements += st.Count()
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
	log *policy.DropLog
	// stagedLog, when set, adds one before every staged difference recorded (see staged.go).
	stagedLog *policy.DropLog
	// staged is whether the last render had staged policies: the drops of the cached rule
	// lines differ with them (see dropTarget).
	staged bool
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

// anew returns a Renderer with rd's settings, changed by set, and nothing rendered: a change of
// settings renders every chain anew.
func (rd *Renderer) anew(set func(*Renderer)) Renderer {
	fresh := Renderer{log: rd.log, stagedLog: rd.stagedLog}
	set(&fresh)
	return fresh
}

// Render turns a Ruleset into kernel content.
func (rd *Renderer) Render(rs *policy.Ruleset) *Rendered {
	rd.prev, rd.cur = rd.cur, newRenderCache()
	if rd.prev.addrSets == nil {
		rd.prev = newRenderCache()
	}
	if staged := rs.Staged != nil; staged != rd.staged {
		// Rule lines rendered with the other kind of drop are of no use.
		rd.prev.policies, rd.prev.cluster = map[*policy.PolicyRules][2][]string{}, map[*policy.ClusterPolicyRules][2][]string{}
		rd.staged = staged
	}
	rs, skipped := policy.FailClosed(rs, policyChecker(rs))
	r := &Rendered{Sets: map[string]*ipset{}, Sources: map[string]string{}, GroupPolicies: map[string][]string{}, Skipped: skipped}
	for fam := range r.Chains {
		r.Chains[fam] = map[string][]string{}
	}
	d := r.dispatch(rs)
	r.hookChains(d.entry, rs.Staged != nil)
	rd.groupChains(r, rs, d.used, d.groupDirs)
	rd.tierGroups(r, rs, policy.AdminTier, d.usedAdmin, d.tierDirs[policy.AdminTier])
	rd.tierGroups(r, rs, policy.BaselineTier, d.usedBaseline, d.tierDirs[policy.BaselineTier])
	if rs.Staged != nil {
		rd.stagedChains(r, rs)
	}
	rd.renderSets(r, rs)
	r.checkNameLengths()
	return r
}

// fail records the first error that makes r unusable.
func (r *Rendered) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}
