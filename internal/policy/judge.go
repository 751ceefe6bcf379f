package policy

import (
	"cmp"
	"net/netip"
	"slices"
)

// Judgement is how a node's Ruleset decides one direction of a connection: the same decision
// the kernel takes from the rules rendered from it, with the objects that take it.
type Judgement struct {
	Direction Direction
	// Admin and Baseline say what each ClusterNetworkPolicy tier did; nil when no policy of
	// the tier selects the local pod in Direction, or when an earlier stage decided.
	Admin, Baseline *TierJudgement
	// Isolated: a policy selects the local pod in this direction, so only its rules admit.
	Isolated bool
	// Selecting are the policies ("namespace/name") that select the local pod in Direction.
	Selecting []string
	Allowed   bool
	// AllowedBy is the first policy (in name order) with a rule that admits the connection,
	// and Rule that rule's index among the policy's rules of this direction.
	AllowedBy string
	Rule      int
}

// TierJudgement is how one ClusterNetworkPolicy tier judged a connection.
type TierJudgement struct {
	// Selecting are the tier's policies that select the local pod, in judging order.
	Selecting []string
	// Policy, Rule and RuleName identify the first rule that matched; Policy is empty when
	// none did, and Action is then Pass (the tier has nothing to say).
	Policy   string
	Rule     int
	RuleName string
	Action   Action
}

// Judge decides direction dir of a connection for the local pod address local: for ingress
// local is the destination and peer the source, for egress local is the source and peer the
// destination. proto and port are the destination's. The stages are those of the kernel: the
// admin tier, NetworkPolicy, the baseline tier, allow.
func (rs *Ruleset) Judge(dir Direction, local, peer netip.Addr, proto Protocol, port uint16) Judgement {
	j := Judgement{Direction: dir, Allowed: true}
	dst := local
	if dir == Egress {
		dst = peer
	}
	if j.Admin = rs.judgeTier(&rs.Admin, dir, local, peer, dst, proto, port); j.Admin != nil && j.Admin.Action != Pass {
		j.Allowed = j.Admin.Action == Accept
		return j
	}
	j = rs.judgeNetworkPolicy(j, local, peer, dst, proto, port)
	if j.Isolated {
		return j
	}
	if j.Baseline = rs.judgeTier(&rs.Baseline, dir, local, peer, dst, proto, port); j.Baseline != nil {
		j.Allowed = j.Baseline.Action != Deny
	}
	return j
}

// judgeTier walks the policies of a tier selecting local in order; nil when none selects it.
func (rs *Ruleset) judgeTier(t *Tier, dir Direction, local, peer, dst netip.Addr, proto Protocol, port uint16) *TierJudgement {
	group, ok := t.Dispatch[dir][local]
	if !ok {
		return nil
	}
	tj := &TierJudgement{Action: Pass}
	for _, chain := range t.Groups[group].Policies {
		cp := rs.ClusterPolicies[chain]
		if cp == nil {
			continue
		}
		tj.Selecting = append(tj.Selecting, cp.Source)
		if tj.Policy != "" {
			continue
		}
		for _, r := range cp.Rules {
			if rs.peerMatches(r.Peers, peer) && rs.portMatches(r.Ports, dst, proto, port) {
				tj.Policy, tj.Rule, tj.RuleName, tj.Action = cp.Source, r.Index, r.Name, r.Action
				break
			}
		}
	}
	return tj
}

// judgeNetworkPolicy is the NetworkPolicy stage of Judge.
func (rs *Ruleset) judgeNetworkPolicy(j Judgement, local, peer, dst netip.Addr, proto Protocol, port uint16) Judgement {
	dir := j.Direction
	group, ok := rs.Dispatch[dir][local]
	if !ok {
		return j
	}
	j.Isolated, j.Allowed = true, false
	chains := slices.Clone(rs.Groups[group].Policies)
	// Policies judge in name order, as the group lists them by chain name; sort by the source
	// policy so that "first" means the same thing to a reader.
	slices.SortFunc(chains, func(a, b string) int {
		return cmp.Compare(rs.Policies[a].sourceOrEmpty(), rs.Policies[b].sourceOrEmpty())
	})
	for _, chain := range chains {
		pr := rs.Policies[chain]
		if pr == nil {
			continue
		}
		if !slices.Contains(j.Selecting, pr.Source) {
			j.Selecting = append(j.Selecting, pr.Source)
		}
		if j.Allowed {
			continue
		}
		for i, r := range pr.Rules {
			if rs.peerMatches(r.Peers, peer) && rs.portMatches(r.Ports, dst, proto, port) {
				j.Allowed, j.AllowedBy, j.Rule = true, pr.Source, i
				break
			}
		}
	}
	return j
}

func (pr *PolicyRules) sourceOrEmpty() string {
	if pr == nil {
		return ""
	}
	return pr.Source
}

// peerMatches reports whether addr is one of peers; no peers means any.
func (rs *Ruleset) peerMatches(peers []Peer, addr netip.Addr) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		switch {
		case p.AddrSet != "":
			if rs.AddrSets[p.AddrSet].Holds(addr) {
				return true
			}
		case p.DomainSet != "":
			if rs.domains != nil && rs.domains.Admits(p.DomainSet, addr) {
				return true
			}
		case p.CIDRSet != "":
			s := rs.CIDRSets[p.CIDRSet]
			if s == nil || s.IPv6 != addr.Is6() {
				continue
			}
			for _, pfx := range s.Prefixes {
				if pfx.Contains(addr) {
					return true
				}
			}
		}
	}
	return false
}

// portMatches reports whether the destination dst:port over proto is one of ports; no ports
// means any.
func (rs *Ruleset) portMatches(ports []PortMatch, dst netip.Addr, proto Protocol, port uint16) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pm := range ports {
		if pm.Protocol != proto {
			continue
		}
		if pm.NamedPortSet != "" {
			if s := rs.NamedPortSets[pm.NamedPortSet]; s != nil && s.Entries.Contains(netip.AddrPortFrom(dst, port)) {
				return true
			}
			continue
		}
		if len(pm.Ranges) == 0 {
			return true
		}
		for _, r := range pm.Ranges {
			if r.First <= port && port <= r.Last {
				return true
			}
		}
	}
	return false
}
