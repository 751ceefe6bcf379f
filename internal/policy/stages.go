package policy

import (
	"net/netip"
	"slices"
)

// Stage is one stage of the judgement of a direction, in judging order: the admin tier of
// ClusterNetworkPolicy, NetworkPolicy, the baseline tier.
type Stage int

const (
	AdminStage Stage = iota
	NetworkPolicyStage
	BaselineStage
)

// StageGroup is where one stage's dispatch leads a local pod address in one direction: the
// fact a backend's dispatch (maps, chains) must hold for the address.
type StageGroup struct {
	Stage Stage
	// Group is the stage's group that the address is dispatched to, "" when none.
	Group string
	// Policies are the group's policies (chain names), in the group's order.
	Policies []string
}

// StageGroups returns where each stage's dispatch leads local in direction dir, in judging
// order. Every stage is listed, as each dispatches independently; which of them judge the
// address (an earlier stage may decide, and a pod NetworkPolicy isolates never meets the
// baseline tier) is Judge's business.
func (rs *Ruleset) StageGroups(dir Direction, local netip.Addr) [3]StageGroup {
	out := [3]StageGroup{{Stage: AdminStage}, {Stage: NetworkPolicyStage}, {Stage: BaselineStage}}
	for i, d := range []struct {
		dispatch map[Direction]map[netip.Addr]string
		groups   map[string]Group
	}{{rs.Admin.Dispatch, rs.Admin.Groups}, {rs.Dispatch, rs.Groups}, {rs.Baseline.Dispatch, rs.Baseline.Groups}} {
		if g, ok := d.dispatch[dir][local]; ok {
			out[i].Group, out[i].Policies = g, d.groups[g].Policies
		}
	}
	return out
}

// PeerSets returns the pod peer sets (names in AddrSets) that the rules of the groups'
// policies name, NetworkPolicies and ClusterNetworkPolicies alike: the sets whose holding of
// the peer a verdict of those groups depends on. Each is listed once, in the order first named.
func (rs *Ruleset) PeerSets(groups ...StageGroup) []string {
	var out []string
	seen := map[string]bool{}
	add := func(peers []Peer) {
		for _, p := range peers {
			if p.AddrSet != "" && !seen[p.AddrSet] {
				seen[p.AddrSet] = true
				out = append(out, p.AddrSet)
			}
		}
	}
	for _, g := range groups {
		for _, name := range g.Policies {
			if pr := rs.Policies[name]; pr != nil {
				for _, r := range pr.Rules {
					add(r.Peers)
				}
			}
			if cp := rs.ClusterPolicies[name]; cp != nil {
				for _, r := range cp.Rules {
					add(r.Peers)
				}
			}
		}
	}
	return out
}

// Holds reports whether s, which may be nil, holds addr.
func (s *AddrSet) Holds(addr netip.Addr) bool {
	if s == nil {
		return false
	}
	return s.Addrs.Contains(addr)
}

// AddressRules names the policies judging local in direction dir (in any stage) that have a
// rule naming addresses (a NetworkPolicy ipBlock, a ClusterNetworkPolicy's networks): the
// verdicts whose outcome depends on the peer's address, not only on its identity.
func (rs *Ruleset) AddressRules(dir Direction, local netip.Addr) []string {
	var out []string
	hasCIDR := func(peers []Peer) bool {
		return slices.ContainsFunc(peers, func(p Peer) bool { return p.CIDRSet != "" })
	}
	for _, sg := range rs.StageGroups(dir, local) {
		for _, chain := range sg.Policies {
			name, found := "", false
			if pr := rs.Policies[chain]; pr != nil {
				name, found = "NetworkPolicy "+pr.Source, slices.ContainsFunc(pr.Rules, func(r Rule) bool { return hasCIDR(r.Peers) })
			} else if cp := rs.ClusterPolicies[chain]; cp != nil {
				name, found = "ClusterNetworkPolicy "+cp.Source, slices.ContainsFunc(cp.Rules, func(r ClusterRule) bool { return hasCIDR(r.Peers) })
			}
			if found && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}
