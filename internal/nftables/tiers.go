package nftables

import (
	"fmt"

	"github.com/netwarden/netwarden/internal/policy"
)

// The ClusterNetworkPolicy tiers, around the NetworkPolicy dispatch of each base chain:
//
//	tier-admin-in-v4 ...            ip daddr vmap: local pod -> admin-grp-ingress-<hash>-v4
//	admin-grp-<dir>-<hash>-v4       jump to each selecting policy's chain, in judging order
//	admin-in/<name>-v4 ...          the policy's rules in order: accept, drop, or
//	                                goto admin-pass-in-v4 (Pass)
//	admin-pass-in-v4                the NetworkPolicy and baseline lookups again, then accept
//	baseline-grp-..., baseline-in/<name>-v4   the same for the baseline tier; Pass accepts
//
// A group chain that finds no matching rule returns to the base chain, which goes on to the
// next stage. An Accept is final for its direction only, because the directions are judged at
// different hooks. Pass must skip the rest of the tier from inside a policy chain, two calls
// deep, which a return cannot do: it jumps with goto to a chain holding the rest of the base
// chain, and that chain always ends in a verdict, so nothing returns to the tier. The per-packet
// work is one lookup per tier and the rules of the policies selecting that pod.

var tiers = []policy.TierName{policy.AdminTier, policy.BaselineTier}

// tierMap names the verdict map dispatching one tier, direction and family.
func tierMap(tier policy.TierName, dir policy.Direction, v6 bool) string {
	d := "-in"
	if dir == policy.Egress {
		d = "-out"
	}
	return "tier-" + string(tier) + d + famSuffix(v6)
}

// passChain names the chain an admin Pass continues in.
func passChain(dir policy.Direction, v6 bool) string {
	d := "-in"
	if dir == policy.Egress {
		d = "-out"
	}
	return "admin-pass" + d + famSuffix(v6)
}

// lookups are the vmap rules of one stage (a tier or NetworkPolicy) in a base chain.
func lookups(dir policy.Direction, mapName func(v6 bool) string) []ruleSpec {
	key := "daddr"
	if dir == policy.Egress {
		key = "saddr"
	}
	return []ruleSpec{
		{peerAddr: key, vmap: mapName(false)},
		{peerAddr: key, vmap: mapName(true), v6: true},
	}
}

// stages returns the judging rules of a direction's base chain after its prelude: the admin
// tier, NetworkPolicy, the baseline tier.
func stages(dir policy.Direction) []ruleSpec {
	var out []ruleSpec
	for _, st := range []policy.Stage{policy.AdminStage, policy.NetworkPolicyStage, policy.BaselineStage} {
		out = append(out, lookups(dir, func(v6 bool) string { return stageMap(st, dir, v6) })...)
	}
	return out
}

// stageMap names the verdict map dispatching one stage, direction and family.
func stageMap(stage policy.Stage, dir policy.Direction, v6 bool) string {
	switch stage {
	case policy.AdminStage:
		return tierMap(policy.AdminTier, dir, v6)
	case policy.NetworkPolicyStage:
		return dispatchMap(dir, v6)
	}
	return tierMap(policy.BaselineTier, dir, v6)
}

// renderTiers adds the tiers' maps and chains to r.
func (rd *Renderer) renderTiers(rs *policy.Ruleset, r *Rendered) {
	// The policy chains first: a group jumps only to those with rules of its family.
	for name, p := range rs.ClusterPolicies {
		cc, ok := rd.prev.clusterPolicies[p]
		if !ok {
			cc = clusterPolicyChains(name, p, rd.log, rd.counters, rd.staged)
		}
		rd.cur.clusterPolicies[p] = cc
		r.Chains[rd.familyChain(name, false)], r.Chains[rd.familyChain(name, true)] = cc.chains[0], cc.chains[1]
		for dc, c := range cc.drops {
			r.Chains[dc] = c
		}
	}
	for _, tier := range tiers {
		groupFams := map[string][2]bool{}
		t := rs.Tier(tier)
		for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			for _, v6 := range []bool{false, true} {
				r.Sets[tierMap(tier, dir, v6)] = rd.verdictMap(t.Dispatch[dir], v6, groupFams,
					fmt.Sprintf("local pods subject to %s ClusterNetworkPolicy for %s -> the group judging them", tier, dir))
			}
		}
		for name, g := range t.Groups {
			rd.cur.tierGroups[name] = rd.renderGroup(r, rd.prev.tierGroups[name], name, g.Policies, groupFams[name], nil)
		}
	}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			var specs []ruleSpec
			for _, st := range stages(dir)[2:] {
				if st.v6 == v6 {
					specs = append(specs, st)
				}
			}
			pass := specChain(append(specs, ruleSpec{}))
			pass.comment = "after an admin Pass: NetworkPolicy, then the baseline tier"
			r.Chains[passChain(dir, v6)] = pass
		}
	}
}

// clusterPolicyChains renders a ClusterNetworkPolicy's rules for one direction (chain names
// it in the Ruleset) as its IPv4 and IPv6 chain, in order, each rule ending in its action's
// verdict. With drop logging a Deny rule goes to a chain of its own that logs and drops,
// which leaves one rule per match: packets the rule does not match cost what they did.
func clusterPolicyChains(name string, p *policy.ClusterPolicyRules, log *policy.DropLog, counters, staged bool) clusterChains {
	var specs [2][]ruleSpec
	var drops map[string]*chain
	for _, rule := range p.Rules {
		var verdict ruleSpec
		switch rule.Action {
		case policy.Deny:
			verdict = dropVerdict(staged, p.Direction)
			if log != nil {
				id := policy.ClusterRuleDropID(name, rule.Index)
				dc := dropChain(id)
				if drops == nil {
					drops = map[string]*chain{}
				}
				drops[dc] = specChain([]ruleSpec{logSpec(log, id), dropVerdict(staged, p.Direction)})
				verdict = ruleSpec{gotoTo: dc}
			}
		case policy.Pass:
			if p.Tier == policy.AdminTier {
				verdict.gotoTo = "pass" // replaced per family below
			}
			// A baseline Pass skips the rest of the baseline tier, and only allow is left.
		}
		verdict.counter = counters
		for _, sp := range expandRule(nil, p.Direction, rule.Peers, rule.Ports, verdict) {
			if sp.gotoTo == "pass" {
				sp.gotoTo = passChain(p.Direction, sp.v6)
			}
			specs[famIndex(sp.v6)] = append(specs[famIndex(sp.v6)], sp)
		}
	}
	return clusterChains{chains: [2]*chain{specChain(specs[0]), specChain(specs[1])}, drops: drops}
}
