// Package nftables renders a policy.Ruleset into one nftables table and keeps the kernel in step
// with it: a full atomic replace on the first sync, small diffs afterwards, and drift repair.
//
// Layout (table inet netwarden):
//
//	forward-egress  (hook forward, priority filter-2)  ip saddr vmap @dispatch-out-v4 ...
//	forward-ingress (hook forward, priority filter-1)  ip daddr vmap @dispatch-in-v4 ...
//	input-egress    (hook input,   priority filter-1)  pod-to-node traffic, judged as the pod's egress
//	grp-<dir>-<hash>  jump to each selecting policy's chain, then drop
//	in/<ns>/<name>, out/<ns>/<name>  one policy's allow rules, each ending in accept
//
// An accept ends only the current base chain, so a packet allowed by egress still meets the
// destination's ingress in the next base chain. Per packet, the work is one map lookup per
// direction plus the rules of the policies that select that pod.
package nftables

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/policy"
)

// TableName is the one nftables table netwarden owns for NetworkPolicy.
const TableName = "netwarden"

const (
	chainForwardEgress  = "forward-egress"
	chainForwardIngress = "forward-ingress"
	chainInputEgress    = "input-egress"
)

// dispatchMap names the verdict map for a direction and family.
func dispatchMap(dir policy.Direction, v6 bool) string {
	d := "in"
	if dir == policy.Egress {
		d = "out"
	}
	return "dispatch-" + d + famSuffix(v6)
}

func famSuffix(v6 bool) string {
	if v6 {
		return "-v6"
	}
	return "-v4"
}

// set is a named set or verdict map with its elements. Keys and values are in nft syntax;
// a map element's value is its verdict.
type set struct {
	typ      string
	interval bool
	isMap    bool
	comment  string
	elements map[string]string
}

type chain struct {
	base    *knftables.Chain // hook, type and priority; nil for a regular chain
	comment string
	rules   []string
}

// Rendered is the complete table content in a form that can be diffed by name.
type Rendered struct {
	Sets   map[string]*set
	Chains map[string]*chain
}

// Stats counts what a Rendered table holds.
type Stats struct{ Chains, Rules, Sets, Elements int }

// Stats returns the object counts of r.
func (r *Rendered) Stats() Stats {
	s := Stats{Chains: len(r.Chains), Sets: len(r.Sets)}
	for _, c := range r.Chains {
		s.Rules += len(c.rules)
	}
	for _, st := range r.Sets {
		s.Elements += len(st.elements)
	}
	return s
}

var ndTypes = "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } accept"

// Renderer turns Rulesets into table content. It remembers what it rendered for each
// published set and policy value, so unchanged ones cost nothing and come out as the same
// pointer, which lets diff skip them without comparing elements.
type Renderer struct {
	prev, cur renderCache
}

type renderCache struct {
	addrSets  map[*policy.AddrSet][2]*set
	namedSets map[*policy.NamedPortSet][2]*set
	cidrSets  map[*policy.CIDRSet]*set
	policies  map[*policy.PolicyRules]*chain
}

func newRenderCache() renderCache {
	return renderCache{addrSets: map[*policy.AddrSet][2]*set{}, namedSets: map[*policy.NamedPortSet][2]*set{},
		cidrSets: map[*policy.CIDRSet]*set{}, policies: map[*policy.PolicyRules]*chain{}}
}

// Render turns a Ruleset into table content with a fresh Renderer.
func Render(rs *policy.Ruleset) *Rendered { return (&Renderer{}).Render(rs) }

// Render turns a Ruleset into table content.
func (rd *Renderer) Render(rs *policy.Ruleset) *Rendered {
	rd.prev, rd.cur = rd.cur, newRenderCache()
	if rd.prev.addrSets == nil {
		rd.prev = newRenderCache()
	}
	r := &Rendered{Sets: map[string]*set{}, Chains: map[string]*chain{}}

	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			typ := "ipv4_addr : verdict"
			if v6 {
				typ = "ipv6_addr : verdict"
			}
			m := &set{typ: typ, isMap: true, elements: map[string]string{},
				comment: fmt.Sprintf("local pods isolated for %s -> the group judging them", dir)}
			for ip, grp := range rs.Dispatch[dir] {
				if ip.Is6() == v6 {
					m.elements[ip.String()] = "jump " + grp
				}
			}
			r.Sets[dispatchMap(dir, v6)] = m
		}
	}

	prelude := []string{"ct state established,related accept", ndTypes}
	r.Chains[chainForwardEgress] = &chain{
		base: baseChain(chainForwardEgress, knftables.ForwardHook, "filter - 2"),
		rules: append(prelude[:2:2],
			"ip saddr vmap @"+dispatchMap(policy.Egress, false),
			"ip6 saddr vmap @"+dispatchMap(policy.Egress, true)),
	}
	r.Chains[chainForwardIngress] = &chain{
		base: baseChain(chainForwardIngress, knftables.ForwardHook, "filter - 1"),
		rules: append(prelude[:2:2],
			"ip daddr vmap @"+dispatchMap(policy.Ingress, false),
			"ip6 daddr vmap @"+dispatchMap(policy.Ingress, true)),
	}
	r.Chains[chainInputEgress] = &chain{
		base: baseChain(chainInputEgress, knftables.InputHook, "filter - 1"),
		rules: append(prelude[:2:2],
			"ip saddr vmap @"+dispatchMap(policy.Egress, false),
			"ip6 saddr vmap @"+dispatchMap(policy.Egress, true)),
	}

	for name, g := range rs.Groups {
		c := &chain{comment: fmt.Sprintf("%s: %d policies", g.Direction, len(g.Policies))}
		for _, p := range g.Policies {
			c.rules = append(c.rules, "jump "+p)
		}
		c.rules = append(c.rules, "drop")
		r.Chains[name] = c
	}
	for name, p := range rs.Policies {
		c, ok := rd.prev.policies[p]
		if !ok {
			c = &chain{comment: fmt.Sprintf("%s of NetworkPolicy %s", p.Direction, p.Source), rules: policyRules(p)}
		}
		rd.cur.policies[p] = c
		r.Chains[name] = c
	}

	for name, as := range rs.AddrSets {
		pair, ok := rd.prev.addrSets[as]
		if !ok {
			v4 := &set{typ: "ipv4_addr", elements: map[string]string{}, comment: "pod peers"}
			v6 := &set{typ: "ipv6_addr", elements: map[string]string{}, comment: "pod peers"}
			for _, ip := range as.Addrs {
				if ip.Is6() {
					v6.elements[ip.String()] = ""
				} else {
					v4.elements[ip.String()] = ""
				}
			}
			pair = [2]*set{v4, v6}
		}
		rd.cur.addrSets[as] = pair
		r.Sets[name+"-v4"], r.Sets[name+"-v6"] = pair[0], pair[1]
	}
	for name, cs := range rs.CIDRSets {
		s, ok := rd.prev.cidrSets[cs]
		if !ok {
			s = &set{typ: "ipv4_addr", interval: true, elements: map[string]string{}, comment: "ipBlock"}
			if cs.IPv6 {
				s.typ = "ipv6_addr"
			}
			for _, p := range cs.Prefixes {
				s.elements[prefixElement(p)] = ""
			}
		}
		rd.cur.cidrSets[cs] = s
		r.Sets[name] = s
	}
	for name, ns := range rs.NamedPortSets {
		pair, ok := rd.prev.namedSets[ns]
		if !ok {
			v4 := &set{typ: "ipv4_addr . inet_service", elements: map[string]string{}, comment: "named port"}
			v6 := &set{typ: "ipv6_addr . inet_service", elements: map[string]string{}, comment: "named port"}
			for _, e := range ns.Entries {
				key := e.Addr().String() + " . " + strconv.Itoa(int(e.Port()))
				if e.Addr().Is6() {
					v6.elements[key] = ""
				} else {
					v4.elements[key] = ""
				}
			}
			pair = [2]*set{v4, v6}
		}
		rd.cur.namedSets[ns] = pair
		r.Sets[name+"-v4"], r.Sets[name+"-v6"] = pair[0], pair[1]
	}
	return r
}

func prefixElement(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func baseChain(name string, hook knftables.BaseChainHook, prio string) *knftables.Chain {
	return &knftables.Chain{
		Name:     name,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(hook),
		Priority: knftables.PtrTo(knftables.BaseChainPriority(prio)),
	}
}

// policyRules expands each policy rule into nft rules: one per peer, port match and, where the
// match is family-specific, IP family. Any one of them accepting means the policy allows.
func policyRules(p *policy.PolicyRules) []string {
	peerAddr := "saddr"
	if p.Direction == policy.Egress {
		peerAddr = "daddr"
	}
	var out []string
	for _, rule := range p.Rules {
		peers := rule.Peers
		if len(peers) == 0 {
			peers = []policy.Peer{{}}
		}
		ports := rule.Ports
		if len(ports) == 0 {
			ports = []policy.PortMatch{{}}
		}
		for _, peer := range peers {
			for _, port := range ports {
				for _, v6 := range families(peer, port) {
					var parts []string
					if e := peerExpr(peer, peerAddr, v6); e != "" {
						parts = append(parts, e)
					}
					if e := portExpr(port, v6); e != "" {
						parts = append(parts, e)
					}
					parts = append(parts, "accept")
					out = append(out, strings.Join(parts, " "))
				}
			}
		}
	}
	return out
}

// families returns the IP families a peer/port pair needs a rule for; a pair that names no
// family-specific set needs one rule for both (reported as IPv4, which renders no family match).
func families(peer policy.Peer, port policy.PortMatch) []bool {
	switch {
	case peer.CIDRSet != "":
		return []bool{peer.IPv6}
	case peer.AddrSet != "" || port.NamedPortSet != "":
		return []bool{false, true}
	}
	return []bool{false}
}

func ipKeyword(v6 bool) string {
	if v6 {
		return "ip6"
	}
	return "ip"
}

func peerExpr(peer policy.Peer, addr string, v6 bool) string {
	switch {
	case peer.AddrSet != "":
		return fmt.Sprintf("%s %s @%s%s", ipKeyword(v6), addr, peer.AddrSet, famSuffix(v6))
	case peer.CIDRSet != "":
		return fmt.Sprintf("%s %s @%s", ipKeyword(v6), addr, peer.CIDRSet)
	}
	return ""
}

func portExpr(port policy.PortMatch, v6 bool) string {
	if port.Protocol == "" {
		return ""
	}
	e := "meta l4proto " + string(port.Protocol)
	switch {
	case port.NamedPortSet != "":
		e += fmt.Sprintf(" %s daddr . th dport @%s%s", ipKeyword(v6), port.NamedPortSet, famSuffix(v6))
	case len(port.Ranges) == 1:
		e += " th dport " + portRange(port.Ranges[0])
	case len(port.Ranges) > 1:
		rs := make([]string, len(port.Ranges))
		for i, r := range port.Ranges {
			rs[i] = portRange(r)
		}
		e += " th dport { " + strings.Join(rs, ", ") + " }"
	}
	return e
}

func portRange(r policy.PortRange) string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
