package policy

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Stats describes a compilation, for logs and metrics.
type Stats struct {
	LocalPods         int // eligible pods on this node
	IsolatedPods      int // local pods selected by at least one policy
	PoliciesSelecting int // policies that select at least one local pod
}

// podInfo is an eligible pod: running or pending with IPs, not on the host network.
type podInfo struct {
	pod *corev1.Pod
	ips []netip.Addr
}

type compiler struct {
	st       *cluster.State
	node     string
	rs       *Ruleset
	nsLabels map[string]labels.Set
	// podsByNS holds every eligible pod in the cluster, the universe of pod peers.
	podsByNS   map[string][]podInfo
	localByNS  map[string][]podInfo
	namespaces []string // sorted, for deterministic set contents
	selCache   map[string]labels.Selector
}

// Compile computes the desired Ruleset for the pods on node.
func Compile(st *cluster.State, node string) (*Ruleset, Stats) {
	c := &compiler{
		st:        st,
		node:      node,
		rs:        NewRuleset(),
		nsLabels:  map[string]labels.Set{},
		podsByNS:  map[string][]podInfo{},
		localByNS: map[string][]podInfo{},
		selCache:  map[string]labels.Selector{},
	}
	c.index()
	return c.rs, c.compile()
}

func (c *compiler) index() {
	for name, ns := range c.st.Namespaces {
		c.nsLabels[name] = labels.Set(ns.Labels)
	}
	for _, pod := range c.st.Pods {
		ips := EligibleIPs(pod)
		if len(ips) == 0 {
			continue
		}
		pi := podInfo{pod: pod, ips: ips}
		c.podsByNS[pod.Namespace] = append(c.podsByNS[pod.Namespace], pi)
		if pod.Spec.NodeName == c.node {
			c.localByNS[pod.Namespace] = append(c.localByNS[pod.Namespace], pi)
		}
		if _, ok := c.nsLabels[pod.Namespace]; !ok {
			// A pod proves its namespace exists even when the Namespace object is not (yet)
			// known, e.g. a manifests directory that declares no namespaces.
			c.nsLabels[pod.Namespace] = labels.Set{cluster.NamespaceNameLabel: pod.Namespace}
		}
	}
	for ns := range c.nsLabels {
		c.namespaces = append(c.namespaces, ns)
	}
	sort.Strings(c.namespaces)
	for _, list := range c.podsByNS {
		sort.Slice(list, func(i, j int) bool { return list[i].pod.Name < list[j].pod.Name })
	}
	for _, list := range c.localByNS {
		sort.Slice(list, func(i, j int) bool { return list[i].pod.Name < list[j].pod.Name })
	}
}

// EligibleIPs returns the IPs of a pod that takes part in policy, or nil: pods without IPs, on
// the host network, or finished are neither targets nor peers.
func EligibleIPs(pod *corev1.Pod) []netip.Addr {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var ips []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		ips = append(ips, a.Unmap())
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	return ips
}

func (c *compiler) compile() Stats {
	var stats Stats
	for _, l := range c.localByNS {
		stats.LocalPods += len(l)
	}
	keys := make([]string, 0, len(c.st.Policies))
	for k, np := range c.st.Policies {
		if len(c.localByNS[np.Namespace]) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)

	// selecting[dir][pod key] lists the chains of the policies that select a local pod.
	selecting := map[Direction]map[string][]string{Ingress: {}, Egress: {}}
	localIPs := map[string][]netip.Addr{}
	for _, k := range keys {
		np := c.st.Policies[k]
		sel := c.selector(&np.Spec.PodSelector)
		var selected []podInfo
		for _, pi := range c.localByNS[np.Namespace] {
			if sel.Matches(labels.Set(pi.pod.Labels)) {
				selected = append(selected, pi)
			}
		}
		if len(selected) == 0 {
			continue
		}
		stats.PoliciesSelecting++
		for _, pt := range np.Spec.PolicyTypes {
			dir := Ingress
			if pt == networkingv1.PolicyTypeEgress {
				dir = Egress
			}
			chain := PolicyChainName(dir, np.Namespace, np.Name)
			c.rs.Policies[chain] = c.compilePolicy(np, dir)
			for _, pi := range selected {
				pk := cluster.Key(pi.pod.Namespace, pi.pod.Name)
				selecting[dir][pk] = append(selecting[dir][pk], chain)
				localIPs[pk] = pi.ips
			}
		}
	}

	isolated := map[string]bool{}
	owner := map[netip.Addr]string{}
	for dir, byPod := range selecting {
		pods := make([]string, 0, len(byPod))
		for pk := range byPod {
			pods = append(pods, pk)
		}
		sort.Strings(pods)
		for _, pk := range pods {
			chains := byPod[pk]
			sort.Strings(chains)
			name := groupName(dir, chains)
			if _, ok := c.rs.Groups[name]; !ok {
				c.rs.Groups[name] = Group{Direction: dir, Policies: chains}
			}
			for _, ip := range localIPs[pk] {
				// Two live pods claiming one IP is a transient state (IP reuse); the pod
				// key order makes the winner deterministic until the stale pod goes away.
				if prev, ok := owner[ip]; ok && prev != pk && dir == Ingress {
					continue
				}
				owner[ip] = pk
				c.rs.Dispatch[dir][ip] = name
			}
			isolated[pk] = true
		}
	}
	stats.IsolatedPods = len(isolated)
	return stats
}

func (c *compiler) selector(ls *metav1.LabelSelector) labels.Selector {
	key := ls.String()
	if s, ok := c.selCache[key]; ok {
		return s
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		// Sources validate selectors; should one slip through, match nothing rather than
		// everything so the failure closes instead of opening.
		s = labels.Nothing()
	}
	c.selCache[key] = s
	return s
}

func (c *compiler) compilePolicy(np *networkingv1.NetworkPolicy, dir Direction) PolicyRules {
	pr := PolicyRules{Direction: dir, Source: cluster.Key(np.Namespace, np.Name)}
	if dir == Ingress {
		for _, r := range np.Spec.Ingress {
			pr.Rules = append(pr.Rules, c.compileRule(np.Namespace, r.From, r.Ports))
		}
	} else {
		for _, r := range np.Spec.Egress {
			pr.Rules = append(pr.Rules, c.compileRule(np.Namespace, r.To, r.Ports))
		}
	}
	return pr
}

func (c *compiler) compileRule(policyNS string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) Rule {
	var rule Rule
	for _, peer := range peers {
		if peer.IPBlock != nil {
			name, v6 := c.cidrSet(peer.IPBlock)
			rule.Peers = append(rule.Peers, Peer{CIDRSet: name, IPv6: v6})
			continue
		}
		rule.Peers = append(rule.Peers, Peer{AddrSet: c.addrSet(policyNS, peer.NamespaceSelector, peer.PodSelector)})
	}
	if len(peers) > 0 && len(rule.Peers) == 0 {
		// Unreachable with validated input; keep "matches nothing" rather than "matches all".
		rule.Peers = append(rule.Peers, Peer{AddrSet: c.addrSet(policyNS, &metav1.LabelSelector{}, nil)})
	}
	rule.Ports = c.compilePorts(ports)
	return rule
}

func (c *compiler) compilePorts(ports []networkingv1.NetworkPolicyPort) []PortMatch {
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
			name := c.namedPortSet(p.Port.StrVal, proto)
			pm := PortMatch{Protocol: proto, NamedPortSet: name}
			if !slices.ContainsFunc(named, func(x PortMatch) bool { return x.NamedPortSet == name }) {
				named = append(named, pm)
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

func (c *compiler) addrSet(policyNS string, nsSel, podSel *metav1.LabelSelector) string {
	key := "ns=" + policyNS
	if nsSel != nil {
		key = "nssel=" + c.selector(nsSel).String()
	}
	podSelector := labels.Everything()
	if podSel != nil {
		podSelector = c.selector(podSel)
	}
	key += "|pods=" + podSelector.String()
	name := "pods-" + shortHash(key)
	if _, ok := c.rs.AddrSets[name]; ok {
		return name
	}
	var namespaces []string
	if nsSel == nil {
		namespaces = []string{policyNS}
	} else {
		s := c.selector(nsSel)
		for _, ns := range c.namespaces {
			if s.Matches(c.nsLabels[ns]) {
				namespaces = append(namespaces, ns)
			}
		}
	}
	ips := []netip.Addr{}
	for _, ns := range namespaces {
		for _, pi := range c.podsByNS[ns] {
			if podSelector.Matches(labels.Set(pi.pod.Labels)) {
				ips = append(ips, pi.ips...)
			}
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	c.rs.AddrSets[name] = slices.Compact(ips)
	return name
}

func (c *compiler) cidrSet(b *networkingv1.IPBlock) (string, bool) {
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
	if _, ok := c.rs.CIDRSets[name]; !ok {
		c.rs.CIDRSets[name] = SubtractPrefixes(cidr, except)
	}
	return name, cidr.Addr().Is6()
}

func (c *compiler) namedPortSet(portName string, proto Protocol) string {
	name := "port-" + portName + "-" + string(proto)
	if _, ok := c.rs.NamedPortSets[name]; ok {
		return name
	}
	entries := []netip.AddrPort{}
	want := corev1.Protocol(strings.ToUpper(string(proto)))
	for _, ns := range c.namespaces {
		for _, pi := range c.podsByNS[ns] {
			for _, ctr := range pi.pod.Spec.Containers {
				for _, cp := range ctr.Ports {
					proto := cp.Protocol
					if proto == "" {
						proto = corev1.ProtocolTCP
					}
					if cp.Name != portName || proto != want {
						continue
					}
					for _, ip := range pi.ips {
						entries = append(entries, netip.AddrPortFrom(ip, uint16(cp.ContainerPort)))
					}
				}
			}
		}
	}
	slices.SortFunc(entries, netip.AddrPort.Compare)
	c.rs.NamedPortSets[name] = slices.Compact(entries)
	return name
}

// SubtractPrefixes returns disjoint prefixes covering cidr minus every except prefix.
func SubtractPrefixes(cidr netip.Prefix, except []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	var walk func(p netip.Prefix)
	walk = func(p netip.Prefix) {
		overlaps := false
		for _, e := range except {
			if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
				return // fully excluded
			}
			if p.Contains(e.Addr()) {
				overlaps = true
			}
		}
		if !overlaps {
			out = append(out, p)
			return
		}
		lo, hi := splitPrefix(p)
		walk(lo)
		walk(hi)
	}
	walk(cidr)
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

// PolicyChainName names the chain holding one policy's rules for one direction. It stays
// readable in `nft list` output; very long names are cut and made unique with a hash.
func PolicyChainName(dir Direction, namespace, name string) string {
	prefix := "in/"
	if dir == Egress {
		prefix = "out/"
	}
	n := prefix + namespace + "/" + name
	if len(n) > 200 {
		n = n[:180] + "~" + shortHash(n)
	}
	return n
}

func groupName(dir Direction, chains []string) string {
	return "grp-" + string(dir) + "-" + shortHash(strings.Join(chains, "\n"))
}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:8])[:12]
}
