package policy

import (
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
)

// compiledPolicy is what one NetworkPolicy object compiles to, independent of other objects:
// its rules per direction and the definitions of the sets they name.
type compiledPolicy struct {
	dirs      []Direction
	rules     map[Direction]*PolicyRules
	addrSets  map[string]addrSetDef
	namedSets map[string]namedSetDef
	cidrSets  map[string]*CIDRSet
}

func (cc *Compiler) compilePolicy(np *networkingv1.NetworkPolicy) *compiledPolicy {
	cp := &compiledPolicy{
		rules:     map[Direction]*PolicyRules{},
		addrSets:  map[string]addrSetDef{},
		namedSets: map[string]namedSetDef{},
		cidrSets:  map[string]*CIDRSet{},
	}
	source := cluster.Key(np.Namespace, np.Name)
	for _, pt := range np.Spec.PolicyTypes {
		pr := &PolicyRules{Source: source}
		if pt == networkingv1.PolicyTypeEgress {
			pr.Direction = Egress
			for _, r := range np.Spec.Egress {
				pr.Rules = append(pr.Rules, cc.compileRule(cp, np.Namespace, r.To, r.Ports))
			}
		} else {
			pr.Direction = Ingress
			for _, r := range np.Spec.Ingress {
				pr.Rules = append(pr.Rules, cc.compileRule(cp, np.Namespace, r.From, r.Ports))
			}
		}
		cp.dirs = append(cp.dirs, pr.Direction)
		cp.rules[pr.Direction] = pr
	}
	return cp
}

func (cc *Compiler) compileRule(cp *compiledPolicy, policyNS string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) Rule {
	var rule Rule
	for _, peer := range peers {
		if peer.IPBlock != nil {
			name, set := cc.cidrSet(peer.IPBlock)
			cp.cidrSets[name] = set
			rule.Peers = append(rule.Peers, Peer{CIDRSet: name, IPv6: set.IPv6})
			continue
		}
		d := cc.addrSetDef(policyNS, peer.NamespaceSelector, peer.PodSelector)
		cp.addrSets[d.name] = d
		rule.Peers = append(rule.Peers, Peer{AddrSet: d.name})
	}
	rule.Ports = compilePorts(cp, ports)
	return rule
}

func compilePorts(cp *compiledPolicy, ports []networkingv1.NetworkPolicyPort) []PortMatch {
	if len(ports) == 0 {
		return nil
	}
	anyPort := map[Protocol]bool{}
	ranges := map[Protocol][]PortRange{}
	var named []PortMatch
	for _, p := range ports {
		proto := TCP
		if p.Protocol != nil {
			proto = Protocol(strings.ToLower(string(*p.Protocol)))
		}
		switch {
		case p.Port == nil:
			anyPort[proto] = true
		case p.Port.Type == intstr.String:
			d := namedSetDef{name: "port-" + p.Port.StrVal + "-" + string(proto), portName: p.Port.StrVal,
				proto: corev1.Protocol(strings.ToUpper(string(proto)))}
			cp.namedSets[d.name] = d
			if !slices.ContainsFunc(named, func(x PortMatch) bool { return x.NamedPortSet == d.name }) {
				named = append(named, PortMatch{Protocol: proto, NamedPortSet: d.name})
			}
		default:
			first := uint16(p.Port.IntVal)
			last := first
			if p.EndPort != nil {
				last = uint16(*p.EndPort)
			}
			ranges[proto] = append(ranges[proto], PortRange{first, last})
		}
	}
	var out []PortMatch
	for _, proto := range []Protocol{TCP, UDP, SCTP} {
		switch {
		case anyPort[proto]:
			out = append(out, PortMatch{Protocol: proto})
		case len(ranges[proto]) > 0:
			out = append(out, PortMatch{Protocol: proto, Ranges: mergeRanges(ranges[proto])})
		}
	}
	for _, n := range named {
		if !anyPort[n.Protocol] {
			out = append(out, n)
		}
	}
	return out
}

// mergeRanges sorts and coalesces overlapping or adjacent ranges, because nftables rejects
// overlapping elements in an anonymous interval set.
func mergeRanges(in []PortRange) []PortRange {
	sort.Slice(in, func(i, j int) bool { return in[i].First < in[j].First })
	out := []PortRange{in[0]}
	for _, r := range in[1:] {
		last := &out[len(out)-1]
		if uint32(r.First) <= uint32(last.Last)+1 {
			if r.Last > last.Last {
				last.Last = r.Last
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func (cc *Compiler) cidrSet(b *networkingv1.IPBlock) (string, *CIDRSet) {
	cidr, _ := netip.ParsePrefix(b.CIDR) // validated by the source
	cidr = cidr.Masked()
	var except []netip.Prefix
	for _, e := range b.Except {
		if p, err := netip.ParsePrefix(e); err == nil {
			except = append(except, p.Masked())
		}
	}
	slices.SortFunc(except, netip.Prefix.Compare)
	key := cidr.String()
	for _, e := range except {
		key += "," + e.String()
	}
	name := "cidr-" + shortHash(key)
	if s, ok := cc.cidrSets[name]; ok {
		return name, s
	}
	s := &CIDRSet{IPv6: cidr.Addr().Is6(), Prefixes: SubtractPrefixes(cidr, except)}
	cc.cidrSets[name] = s
	return name, s
}

// SubtractPrefixes returns disjoint prefixes covering cidr minus every except prefix, in
// address order. Each half of a split is walked with only the excepts inside it, so the work
// is the number of excepts times the prefix length, not its square: an ipBlock may hold
// thousands of excepts.
func SubtractPrefixes(cidr netip.Prefix, except []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	var walk func(p netip.Prefix, except []netip.Prefix)
	walk = func(p netip.Prefix, except []netip.Prefix) {
		var inside []netip.Prefix
		for _, e := range except {
			if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
				return // fully excluded
			}
			if p.Contains(e.Addr()) {
				inside = append(inside, e)
			}
		}
		if len(inside) == 0 {
			out = append(out, p)
			return
		}
		lo, hi := splitPrefix(p)
		walk(lo, inside)
		walk(hi, inside)
	}
	walk(cidr, except)
	return out
}

func splitPrefix(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	lo := netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	idx := p.Bits() / 8
	b[idx] |= 0x80 >> (p.Bits() % 8)
	hiAddr, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(hiAddr, bits)
}

func intOrString(n int32) *intstr.IntOrString {
	v := intstr.FromInt32(n)
	return &v
}

func namedPort(name string) *intstr.IntOrString {
	v := intstr.FromString(name)
	return &v
}
