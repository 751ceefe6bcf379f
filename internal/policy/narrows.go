package policy

import "slices"

// Narrows reports whether rs may deny a packet that prev allowed. False is a promise: every
// verdict of rs allows at least what prev allowed, so established flows need no second look
// (the agent's conntrack pass walks the kernel's whole connection table, several
// milliseconds that most changes, such as a policy added for already isolated pods, cannot
// need). True may be a false alarm: the check is conservative where it would have to
// compare contents, and anything about ClusterNetworkPolicy tiers counts as narrowing.
//
// NetworkPolicy verdicts only widen when no pod becomes isolated, every isolated pod's group
// keeps all the policies it had, those policies' rules are the same objects (the compiler
// hands out a new PolicyRules for a changed policy), and no peer set loses a member (ipBlock
// sets are named by their content, so they cannot lose one).
func (rs *Ruleset) Narrows(prev *Ruleset) bool {
	if prev == nil {
		return true
	}
	for _, t := range []*Tier{&rs.Admin, &rs.Baseline, &prev.Admin, &prev.Baseline} {
		if len(t.Dispatch[Ingress])+len(t.Dispatch[Egress]) > 0 {
			return true
		}
	}
	for _, dir := range []Direction{Ingress, Egress} {
		was, now := prev.Dispatch[dir], rs.Dispatch[dir]
		for addr, group := range now {
			old, ok := was[addr]
			if !ok {
				return true // newly isolated
			}
			kept := rs.Groups[group].Policies
			for _, chain := range prev.Groups[old].Policies {
				if _, found := slices.BinarySearch(kept, chain); !found || rs.Policies[chain] != prev.Policies[chain] {
					return true
				}
			}
		}
	}
	for name, s := range rs.AddrSets {
		if p := prev.AddrSets[name]; p != nil && s != p && (s.Prev != p || len(s.Removed) > 0) {
			return true
		}
	}
	for name, s := range rs.NamedPortSets {
		if p := prev.NamedPortSets[name]; p != nil && s != p && (s.Prev != p || len(s.Removed) > 0) {
			return true
		}
	}
	return false
}
