package nftables

import (
	"fmt"
	"strings"

	"github.com/netwarden/netwarden/internal/policy"
)

var ndTypes = "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } accept"

// ruleSpec is a rule of a group or policy chain in structured form. Its text (what nft
// parses on a full sync) and its netlink expressions (what an incremental sync sends) are both
// derived from it, so the two paths always program the same rule.
type ruleSpec struct {
	v6       bool   // family of the address matches
	peerAddr string // "saddr" or "daddr" when the rule matches a peer set
	peerSet  string
	proto    policy.Protocol // "" matches every protocol
	ports    policy.PortRange
	namedSet string // destination address . port lookup
	jump     string // verdict: jump to this chain; else goto gotoTo; else drop when drop, else accept
	gotoTo   string
	drop     bool
	// log, when set, makes a rule with no verdict: for the first packet of a connection, within
	// the rate limit, send the packet to NFLOG with logPrefix.
	log       *policy.DropLog
	logPrefix string
	// counter counts the packets the rule matches, just before its verdict.
	counter bool

	// The rules of the base and pass chains, each its own kind:
	// vmap makes "ip|ip6 <peerAddr> vmap @<vmap>": the verdict map decides.
	vmap string
	// established makes "ct state established,related accept".
	established bool
	// neighborDiscovery makes the rule that accepts IPv6 neighbour discovery (ndTypes).
	neighborDiscovery bool
}

// logSpec is the rule logging a drop whose ID is id; the drop follows it. Only packets of
// new connections are logged, so that each denied attempt logs once however long the peer
// retries within it, and the limit is in the kernel, so that a flood is cut where it arises.
func logSpec(l *policy.DropLog, id string) ruleSpec { return ruleSpec{log: l, logPrefix: id} }

func (r ruleSpec) text() string {
	switch {
	case r.vmap != "":
		return fmt.Sprintf("%s %s vmap @%s", ipKeyword(r.v6), r.peerAddr, r.vmap)
	case r.established:
		return "ct state established,related accept"
	case r.neighborDiscovery:
		return ndTypes
	}
	var parts []string
	if r.proto != "" {
		parts = append(parts, "meta l4proto "+string(r.proto))
		if r.namedSet == "" && r.ports.Last != 0 {
			parts = append(parts, "th dport "+portRange(r.ports))
		}
	}
	if r.peerSet != "" {
		parts = append(parts, fmt.Sprintf("%s %s @%s", ipKeyword(r.v6), r.peerAddr, r.peerSet))
	}
	if r.namedSet != "" {
		parts = append(parts, fmt.Sprintf("%s daddr . th dport @%s", ipKeyword(r.v6), r.namedSet))
	}
	if r.counter {
		parts = append(parts, "counter")
	}
	switch {
	case r.log != nil:
		parts = append(parts, fmt.Sprintf("ct state new limit rate %d/second burst %d packets log prefix %q group %d",
			r.log.Rate, r.log.Burst, r.logPrefix, r.log.Group))
	case r.jump != "":
		parts = append(parts, "jump "+r.jump)
	case r.gotoTo != "":
		parts = append(parts, "goto "+r.gotoTo)
	case r.drop:
		parts = append(parts, "drop")
	default:
		parts = append(parts, "accept")
	}
	return strings.Join(parts, " ")
}

// specChain builds a chain from its rules in structured form. Group and policy chains carry
// no comment (their names say what they are): an incremental sync creates them over netlink,
// which writes chain comments only through nftnl.Comments, and both paths must leave
// identical tables.
func specChain(specs []ruleSpec) *chain {
	c := &chain{specs: specs, rules: make([]string, len(specs))}
	for i, sp := range specs {
		c.rules[i] = sp.text()
	}
	return c
}

// policyChains renders a policy's rules as its IPv4 and its IPv6 chain.
func policyChains(p *policy.PolicyRules, counters bool) [2]*chain {
	var specs [2][]ruleSpec
	for _, sp := range policyRules(p, counters) {
		specs[famIndex(sp.v6)] = append(specs[famIndex(sp.v6)], sp)
	}
	return [2]*chain{specChain(specs[0]), specChain(specs[1])}
}

// policyRules expands each policy rule into nft rules: one per peer, port range and IP family.
// Any one of them accepting means the policy allows.
func policyRules(p *policy.PolicyRules, counters bool) []ruleSpec {
	var out []ruleSpec
	for _, rule := range p.Rules {
		out = expandRule(out, p.Direction, rule.Peers, rule.Ports, ruleSpec{counter: counters})
	}
	return out
}

// expandRule appends the nft rules of one model rule (see policy.Matches), each ending in
// verdict's verdict.
func expandRule(out []ruleSpec, dir policy.Direction, peers []policy.Peer, ports []policy.PortMatch, verdict ruleSpec) []ruleSpec {
	peerAddr := "saddr"
	if dir == policy.Egress {
		peerAddr = "daddr"
	}
	for m := range policy.Matches(peers, ports) {
		sp := verdict
		sp.v6, sp.proto, sp.ports = m.IPv6, m.Port.Protocol, m.Range
		switch {
		case m.Peer.AddrSet != "":
			sp.peerAddr, sp.peerSet = peerAddr, m.Peer.AddrSet+famSuffix(m.IPv6)
		case m.Peer.CIDRSet != "":
			sp.peerAddr, sp.peerSet = peerAddr, m.Peer.CIDRSet
		case m.Peer.DomainSet != "":
			sp.peerAddr, sp.peerSet = peerAddr, m.Peer.DomainSet+famSuffix(m.IPv6)
		}
		if m.Port.NamedPortSet != "" {
			sp.namedSet = m.Port.NamedPortSet + famSuffix(m.IPv6)
		}
		out = append(out, sp)
	}
	return out
}

func ipKeyword(v6 bool) string {
	if v6 {
		return "ip6"
	}
	return "ip"
}

func portRange(r policy.PortRange) string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}
