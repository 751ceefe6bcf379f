package policy

import (
	"slices"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
)

// SkippedPolicy is a NetworkPolicy a backend cannot express, and why. The backend applies
// it fail-closed: the pods it selects stay isolated in its directions, but it admits nothing.
// It is dataplane's type, because a backend's SyncResult reports it.
type SkippedPolicy = dataplane.Skipped

// FailClosed returns rs without the rules of every policy that check rejects, and those
// policies sorted by name. check is asked about each direction of each policy (by chain
// name); one rejected direction skips the whole policy, whose chains are left out of the
// groups that held them. The groups and the dispatch stay as they are, so the pods the
// policy selects are still isolated and judged by their other policies; sets that no
// remaining NetworkPolicy and no ClusterNetworkPolicy uses are left out too. One policy that cannot be expressed thus never
// fails the sync of the others. rs itself is not modified; when every policy passes, rs
// is returned.
func FailClosed(rs *Ruleset, check func(chain string, pr *PolicyRules) error) (*Ruleset, []SkippedPolicy) {
	var skipped []SkippedPolicy
	bad := map[string]bool{}
	for chain, pr := range rs.Policies {
		if bad[pr.Source] {
			continue
		}
		if err := check(chain, pr); err != nil {
			bad[pr.Source] = true
			skipped = append(skipped, SkippedPolicy{Policy: pr.Source, Reason: err.Error()})
		}
	}
	if len(skipped) == 0 {
		return rs, nil
	}
	slices.SortFunc(skipped, func(a, b SkippedPolicy) int { return strings.Compare(a.Policy, b.Policy) })

	out := *rs
	out.Policies = make(map[string]*PolicyRules, len(rs.Policies))
	addrs, cidrs, named := map[string]bool{}, map[string]bool{}, map[string]bool{}
	use := func(peers []Peer, ports []PortMatch) {
		for _, p := range peers {
			addrs[p.AddrSet], cidrs[p.CIDRSet] = true, true
		}
		for _, p := range ports {
			named[p.NamedPortSet] = true
		}
	}
	for chain, pr := range rs.Policies {
		if bad[pr.Source] {
			continue
		}
		out.Policies[chain] = pr
		for _, r := range pr.Rules {
			use(r.Peers, r.Ports)
		}
	}
	// The ClusterNetworkPolicies' rules stay whole, and so do the sets they name (which a
	// skipped NetworkPolicy may have shared with them).
	for _, cp := range rs.ClusterPolicies {
		for _, r := range cp.Rules {
			use(r.Peers, r.Ports)
		}
	}
	// The staged judges stay whole as well: they name no policy's chain, only sets.
	if rs.Staged != nil {
		for _, j := range rs.Staged.Judges {
			for _, seg := range j.Segments {
				for _, r := range seg.Rules {
					use(r.Peers, r.Ports)
				}
			}
		}
	}
	out.Groups = make(map[string]Group, len(rs.Groups))
	for name, g := range rs.Groups {
		if slices.ContainsFunc(g.Policies, func(c string) bool { return out.Policies[c] == nil }) {
			g.Policies = slices.DeleteFunc(slices.Clone(g.Policies), func(c string) bool { return out.Policies[c] == nil })
		}
		out.Groups[name] = g
	}
	out.AddrSets = onlyUsed(rs.AddrSets, addrs)
	out.CIDRSets = onlyUsed(rs.CIDRSets, cidrs)
	out.NamedPortSets = onlyUsed(rs.NamedPortSets, named)
	return &out, skipped
}

func onlyUsed[V any](all map[string]V, used map[string]bool) map[string]V {
	out := make(map[string]V, len(all))
	for name, v := range all {
		if used[name] {
			out[name] = v
		}
	}
	return out
}
