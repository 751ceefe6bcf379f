package iptables

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/netwarden/netwarden/internal/policy"
)

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
// the policy's key in the Ruleset. With staged policies a drop goes to the after-drop
// judgement instead (see dropTarget).
func clusterPolicyLines(chain string, p *policy.ClusterPolicyRules, logDrops, staged bool) ([2][]string, error) {
	var out [2][]string
	for i, rule := range p.Rules {
		var target string
		switch rule.Action {
		case policy.Accept:
			target = "-j RETURN"
		case policy.Deny:
			target = dropTarget(staged, p.Direction)
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
		case m.Peer.DomainSet != "":
			parts = append(parts, "-m set --match-set "+domainSetName(m.Peer.DomainSet, fam)+" "+peerDir)
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

// logLine is the rule logging a drop whose ID is id; the drop follows it. Only packets of new
// connections are logged, so that each denied attempt logs once, and the limit is in the
// kernel, so that a flood is cut where it arises. The spelling is iptables-save's, which
// Verify compares with (it leaves out a burst of 5, xt_limit's default).
func logLine(l *policy.DropLog, id string) string {
	burst := ""
	if l.Burst != 5 {
		burst = fmt.Sprintf(" --limit-burst %d", l.Burst)
	}
	return fmt.Sprintf("-m conntrack --ctstate NEW -m limit --limit %d/sec%s -j NFLOG --nflog-prefix %q --nflog-group %d",
		l.Rate, burst, id, l.Group)
}
