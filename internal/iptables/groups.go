package iptables

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/netwarden/netwarden/internal/policy"
)

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
				lines, err := cachedLines(rd.cur.cluster, rd.prev.cluster, cp, func() ([2][]string, error) {
					return clusterPolicyLines(p, cp, rd.log != nil, rd.staged)
				})
				if err != nil {
					r.fail(err)
					continue
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
				r.Chains[fam][chain] = []string{logLine(rd.log, id), dropTarget(rd.staged, cp.Direction)}
			}
		}
	}
}

// groupChains writes the NetworkPolicy group chains, for the families used says their pods
// are in: each holds its policies' rules, then drops (after logging, with drop logging on).
func (rd *Renderer) groupChains(r *Rendered, rs *policy.Ruleset, used map[string][2]bool, dirs map[string]policy.Direction) {
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
				lines, _ := cachedLines(rd.cur.policies, rd.prev.policies, pr, func() ([2][]string, error) { return policyLines(pr), nil })
				rules = append(rules, lines[fam]...)
			}
			if rd.log != nil {
				rules = append(rules, logLine(rd.log, policy.GroupDropID(name)))
			}
			r.Chains[fam][chain] = append(rules, dropTarget(rd.staged, dirs[name]))
			r.GroupPolicies[chain] = g.Policies
		}
	}
}

// cachedLines returns the rule lines of a policy value: those this render or the last one made
// for it, else render's, which are cached unless render fails (the next render reports it
// again).
func cachedLines[K comparable](cur, prev map[K][2][]string, key K, render func() ([2][]string, error)) ([2][]string, error) {
	if lines, ok := cur[key]; ok {
		return lines, nil
	}
	lines, ok := prev[key]
	if !ok {
		var err error
		if lines, err = render(); err != nil {
			return lines, err
		}
	}
	cur[key] = lines
	return lines, nil
}
