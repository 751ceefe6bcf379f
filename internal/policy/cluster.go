package policy

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/sortedset"
)

// compiledClusterPolicy is what one ClusterNetworkPolicy compiles to on its own: its rules per
// direction and the definitions of the sets they name. Like compiledPolicy it is kept by
// object pointer, so an unchanged object is not compiled again.
type compiledClusterPolicy struct {
	tier      TierName
	rules     map[Direction]*ClusterPolicyRules
	addrSets  map[string]addrSetDef
	namedSets map[string]namedSetDef
	cidrSets  map[string]*CIDRSet
	domains   map[string]*DomainSet
	nodeSels  map[string]*metav1.LabelSelector // node peer sets by name
	// subject caches the local pods the subject selects, valid while localGen holds.
	subject    []*podInfo
	subjectGen uint64
}

// clusterPolicyOrder sorts ClusterNetworkPolicies the way a tier judges them: ascending
// priority, ties broken by name (as the reference implementation does).
func clusterPolicyOrder(a, b *npav1beta1.ClusterNetworkPolicy) int {
	if c := cmp.Compare(a.Spec.Priority, b.Spec.Priority); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// clusterPart is what the ClusterNetworkPolicies contribute to a Ruleset: both tiers, the
// chains of the policies selecting a local pod, and the sets their rules name. It depends on the
// policies, the nodes (node peers), and the local pods and namespace labels (localGen): while
// none of them changed, the last part is contributed again. Built anew, it walks every policy
// for every local pod, which at 1,000 policies was a fifth of the agent's CPU under pod churn
// elsewhere in the cluster.
type clusterPart struct {
	localGen        uint64
	admin, baseline Tier
	policies        map[string]*ClusterPolicyRules
	addrDefs        map[string]addrSetDef
	namedDefs       map[string]namedSetDef
	cidrSets        map[string]*CIDRSet
	domains         map[string]*DomainSet
	selecting       int
}

func newClusterPart(localGen uint64) *clusterPart {
	return &clusterPart{localGen: localGen, admin: newTier(), baseline: newTier(), policies: map[string]*ClusterPolicyRules{},
		addrDefs: map[string]addrSetDef{}, namedDefs: map[string]namedSetDef{}, cidrSets: map[string]*CIDRSet{}, domains: map[string]*DomainSet{}}
}

func (p *clusterPart) tier(n TierName) *Tier {
	if n == AdminTier {
		return &p.admin
	}
	return &p.baseline
}

// addTo puts the part into rs and the set definitions of the compile. The maps only the part
// fills are shared with rs, which nothing changes once compiled.
func (p *clusterPart) addTo(rs *Ruleset, stats *Stats, nodeSets map[string]*AddrSet, addrDefs map[string]addrSetDef, namedDefs map[string]namedSetDef) {
	rs.Admin, rs.Baseline = p.admin, p.baseline
	rs.ClusterPolicies, rs.DomainSets = p.policies, p.domains
	maps.Copy(rs.CIDRSets, p.cidrSets)
	maps.Copy(rs.AddrSets, nodeSets)
	maps.Copy(addrDefs, p.addrDefs)
	maps.Copy(namedDefs, p.namedDefs)
	stats.ClusterPoliciesSelecting = p.selecting
}

// compileClusterPolicies adds both tiers to rs: each ClusterNetworkPolicy whose subject selects
// a local pod contributes its chains, and each local pod gets, per tier and direction, the
// group of the policies selecting it in judging order. inputsChanged says the policies or the
// nodes may have changed since the last compile.
func (cc *Compiler) compileClusterPolicies(st *cluster.State, rs *Ruleset, stats *Stats,
	addrDefs map[string]addrSetDef, namedDefs map[string]namedSetDef, inputsChanged bool) {
	if len(st.ClusterPolicies) == 0 {
		cc.clusterPolicies = nil
		cc.nodeSets = nil
		cc.clusterPart = nil
		return
	}
	if p := cc.clusterPart; p != nil && !inputsChanged && p.localGen == cc.localGen {
		for cnp := range maps.Keys(cc.clusterPolicies) {
			cc.subjectSelectors(cnp) // kept in the cache for the next compile that needs them
		}
		p.addTo(rs, stats, cc.nodeSets, addrDefs, namedDefs)
		return
	}
	part := newClusterPart(cc.localGen)
	byTier := map[TierName][]*npav1beta1.ClusterNetworkPolicy{}
	for _, cnp := range st.ClusterPolicies {
		t := BaselineTier
		if cnp.Spec.Tier == npav1beta1.AdminTier {
			t = AdminTier
		}
		byTier[t] = append(byTier[t], cnp)
	}
	used := make(map[*npav1beta1.ClusterNetworkPolicy]*compiledClusterPolicy, len(st.ClusterPolicies))
	nodeSels := map[string]*metav1.LabelSelector{}
	for _, tier := range []TierName{AdminTier, BaselineTier} {
		list := byTier[tier]
		slices.SortFunc(list, clusterPolicyOrder)
		selecting := map[Direction]map[string][]string{Ingress: {}, Egress: {}}
		for _, cnp := range list {
			ccp := cc.clusterPolicies[cnp]
			if ccp == nil {
				ccp = cc.compileClusterPolicy(cnp, tier)
			}
			used[cnp] = ccp
			selected := cc.clusterSubject(cnp, ccp)
			if len(selected) == 0 {
				continue
			}
			part.selecting++
			for _, dir := range []Direction{Ingress, Egress} {
				rules := ccp.rules[dir]
				if rules == nil {
					continue
				}
				chain := ClusterPolicyChainName(tier, dir, cnp.Name)
				part.policies[chain] = rules
				for _, pi := range selected {
					selecting[dir][pi.key] = append(selecting[dir][pi.key], chain)
				}
			}
			maps.Copy(part.addrDefs, ccp.addrSets)
			maps.Copy(part.namedDefs, ccp.namedSets)
			maps.Copy(part.cidrSets, ccp.cidrSets)
			maps.Copy(part.domains, ccp.domains)
			for name, sel := range ccp.nodeSels {
				nodeSels[name] = sel
			}
		}
		t := part.tier(tier)
		for dir, byPod := range selecting {
			cc.dispatch(cc.groupNamer(string(tier), dir), t.Dispatch[dir], t.Groups, dir, byPod, func(chains []string) string {
				return tierGroupName(tier, dir, chains)
			})
		}
	}
	cc.clusterPolicies = used
	cc.nodeAddrSets(st, nodeSels)
	cc.clusterPart = part
	part.addTo(rs, stats, cc.nodeSets, addrDefs, namedDefs)
}

// subjectSelectors returns the selectors of cnp's subject, from the cache (which keeps them
// for the next compile, as it drops what a compile did not ask for). podSel is unset for a
// subject of whole namespaces, nsSel too for an unknown subject.
func (cc *Compiler) subjectSelectors(cnp *npav1beta1.ClusterNetworkPolicy) (nsSel, podSel parsedSelector) {
	switch subj := cnp.Spec.Subject; {
	case subj.Namespaces != nil:
		nsSel = cc.sels.get(subj.Namespaces)
	case subj.Pods != nil:
		nsSel, podSel = cc.sels.get(&subj.Pods.NamespaceSelector), cc.sels.get(&subj.Pods.PodSelector)
	}
	return nsSel, podSel
}

// clusterSubject returns the local pods cnp's subject selects.
func (cc *Compiler) clusterSubject(cnp *npav1beta1.ClusterNetworkPolicy, ccp *compiledClusterPolicy) []*podInfo {
	nsSel, podSel := cc.subjectSelectors(cnp)
	if nsSel.sel == nil {
		return nil // validated away; selecting nothing keeps an unknown subject harmless
	}
	if ccp.subjectGen == cc.localGen && ccp.subjectGen != 0 {
		return ccp.subject
	}
	var selected []*podInfo
	for _, pi := range cc.local {
		if !nsSel.sel.Matches(cc.nsLabels[pi.pod.Namespace]) {
			continue
		}
		if podSel.sel != nil && !podSel.sel.Matches(pi.labels()) {
			continue
		}
		selected = append(selected, pi)
	}
	slices.SortFunc(selected, func(a, b *podInfo) int { return strings.Compare(a.key, b.key) })
	ccp.subject, ccp.subjectGen = selected, cc.localGen
	return selected
}

func (cc *Compiler) compileClusterPolicy(cnp *npav1beta1.ClusterNetworkPolicy, tier TierName) *compiledClusterPolicy {
	ccp := &compiledClusterPolicy{
		tier:      tier,
		rules:     map[Direction]*ClusterPolicyRules{},
		addrSets:  map[string]addrSetDef{},
		namedSets: map[string]namedSetDef{},
		cidrSets:  map[string]*CIDRSet{},
		domains:   map[string]*DomainSet{},
		nodeSels:  map[string]*metav1.LabelSelector{},
	}
	newRules := func(dir Direction) *ClusterPolicyRules {
		return &ClusterPolicyRules{Tier: tier, Direction: dir, Source: cnp.Name, Priority: cnp.Spec.Priority}
	}
	// A policy with no rules for a direction says nothing about it: unlike a NetworkPolicy it
	// does not isolate, so it gets no chain there.
	if len(cnp.Spec.Ingress) > 0 {
		pr := newRules(Ingress)
		for i, r := range cnp.Spec.Ingress {
			peers := make([]clusterPeer, len(r.From))
			for i, p := range r.From {
				peers[i] = clusterPeer{namespaces: p.Namespaces, pods: p.Pods}
			}
			if rule, ok := cc.compileClusterRule(ccp, r.Name, r.Action, peers, r.Protocols); ok {
				rule.Index = i
				pr.Rules = append(pr.Rules, rule)
			}
		}
		ccp.rules[Ingress] = pr
	}
	if len(cnp.Spec.Egress) > 0 {
		pr := newRules(Egress)
		for i, r := range cnp.Spec.Egress {
			peers := make([]clusterPeer, len(r.To))
			for i, p := range r.To {
				peers[i] = clusterPeer{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks, domains: p.DomainNames}
			}
			if rule, ok := cc.compileClusterRule(ccp, r.Name, r.Action, peers, r.Protocols); ok {
				rule.Index = i
				pr.Rules = append(pr.Rules, rule)
			}
		}
		ccp.rules[Egress] = pr
	}
	return ccp
}

// clusterPeer is an ingress or egress peer of a ClusterNetworkPolicy rule; ingress peers have
// only the first two fields.
type clusterPeer struct {
	namespaces *metav1.LabelSelector
	pods       *npav1beta1.NamespacedPod
	nodes      *metav1.LabelSelector
	networks   []npav1beta1.CIDR
	domains    []npav1beta1.DomainName
}

// compileClusterRule compiles one rule; ok is false when the rule can match nothing.
func (cc *Compiler) compileClusterRule(ccp *compiledClusterPolicy, name string, action npav1beta1.ClusterNetworkPolicyRuleAction,
	peers []clusterPeer, protocols []npav1beta1.ClusterNetworkPolicyProtocol) (ClusterRule, bool) {
	rule := ClusterRule{Name: name}
	switch action {
	case npav1beta1.ClusterNetworkPolicyRuleActionAccept:
		rule.Action = Accept
	case npav1beta1.ClusterNetworkPolicyRuleActionDeny:
		rule.Action = Deny
	default:
		rule.Action = Pass
	}
	anyPeer := false
	for _, p := range peers {
		switch {
		case p.namespaces != nil:
			d := cc.addrSetDef("", p.namespaces, nil)
			ccp.addrSets[d.name] = d
			rule.Peers = append(rule.Peers, Peer{AddrSet: d.name})
		case p.pods != nil:
			d := cc.addrSetDef("", &p.pods.NamespaceSelector, &p.pods.PodSelector)
			ccp.addrSets[d.name] = d
			rule.Peers = append(rule.Peers, Peer{AddrSet: d.name})
		case p.nodes != nil:
			name := "nodes-" + shortHash(cc.sels.get(p.nodes).key)
			ccp.nodeSels[name] = p.nodes
			rule.Peers = append(rule.Peers, Peer{AddrSet: name})
		case len(p.networks) > 0:
			for _, n := range p.networks {
				name, set := cc.cidrSet(&networkingv1.IPBlock{CIDR: string(n)})
				ccp.cidrSets[name] = set
				rule.Peers = append(rule.Peers, Peer{CIDRSet: name, IPv6: set.IPv6})
			}
		case len(p.domains) > 0 && rule.Action == Accept:
			for _, d := range p.domains {
				pattern := DomainPattern(string(d))
				name := DomainSetName(pattern)
				ccp.domains[name] = &DomainSet{Pattern: pattern}
				rule.Peers = append(rule.Peers, Peer{DomainSet: name})
			}
		default:
			// A peer of no field this agent knows (one added by a later API version, or
			// domainNames under another action than Accept, which validation refuses) fails
			// closed: it admits nothing, and it denies or passes everything.
			if rule.Action != Accept {
				anyPeer = true
			}
		}
	}
	if anyPeer {
		rule.Peers = nil
	} else if len(rule.Peers) == 0 {
		return rule, false
	}
	ports, known := compileClusterPorts(ccp, protocols)
	if !known {
		// Only protocol entries of no kind this agent knows (a later API version): fail
		// closed as for peers, admitting nothing and denying or passing every port.
		if rule.Action == Accept {
			return rule, false
		}
		ports = nil
	}
	rule.Ports = ports
	return rule, true
}

// compileClusterPorts turns a rule's protocols into port matches; none means every port and
// protocol. A named port has no protocol of its own: it matches the container port of that
// name whatever its protocol. known is false when protocols are given but none is of a kind
// this agent knows.
func compileClusterPorts(ccp *compiledClusterPolicy, protocols []npav1beta1.ClusterNetworkPolicyProtocol) (ports []PortMatch, known bool) {
	if len(protocols) == 0 {
		return nil, true
	}
	var nps []networkingv1.NetworkPolicyPort
	add := func(proto corev1.Protocol, p *npav1beta1.Port) {
		np := networkingv1.NetworkPolicyPort{Protocol: &proto}
		if p != nil {
			if p.Range != nil {
				first, last := p.Range.Start, p.Range.End
				np.Port = intOrString(first)
				np.EndPort = &last
			} else {
				np.Port = intOrString(p.Number)
			}
		}
		nps = append(nps, np)
	}
	for _, pr := range protocols {
		switch {
		case pr.TCP != nil:
			add(corev1.ProtocolTCP, pr.TCP.DestinationPort)
		case pr.UDP != nil:
			add(corev1.ProtocolUDP, pr.UDP.DestinationPort)
		case pr.SCTP != nil:
			add(corev1.ProtocolSCTP, pr.SCTP.DestinationPort)
		case pr.DestinationNamedPort != "":
			for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
				p := proto
				nps = append(nps, networkingv1.NetworkPolicyPort{Protocol: &p, Port: namedPort(pr.DestinationNamedPort)})
			}
		}
	}
	if len(nps) == 0 {
		return nil, false
	}
	cp := &compiledPolicy{namedSets: ccp.namedSets}
	return compilePorts(cp, nps), true
}

// nodeAddrSets publishes the node peer sets: the addresses of the Nodes each selector matches.
// An unchanged content keeps its previous value, so renderers see it unchanged.
func (cc *Compiler) nodeAddrSets(st *cluster.State, sels map[string]*metav1.LabelSelector) {
	prev := cc.nodeSets
	cc.nodeSets = make(map[string]*AddrSet, len(sels))
	for name, ls := range sels {
		sel := cc.sels.get(ls)
		var addrs []netip.Addr
		for _, n := range st.Nodes {
			if !sel.sel.Matches(labelsOf(n.Labels)) {
				continue
			}
			for _, a := range n.Status.Addresses {
				if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
					continue
				}
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					addrs = append(addrs, ip.Unmap())
				}
			}
		}
		set := sortedset.Of(addrs...)
		s := prev[name]
		if s == nil || !s.Addrs.Equal(set) {
			s = &AddrSet{Addrs: set}
		}
		cc.nodeSets[name] = s
	}
}

// ClusterPolicyChainName names the chain holding one ClusterNetworkPolicy's rules for one
// direction: admin-in/<name>, baseline-out/<name>. Long names are cut and made unique with a
// hash, as for NetworkPolicy.
func ClusterPolicyChainName(tier TierName, dir Direction, name string) string {
	d := "-in/"
	if dir == Egress {
		d = "-out/"
	}
	n := string(tier) + d + name
	if len(n) > 200 {
		n = n[:180] + "_" + shortHash(n)
	}
	return n
}

// tierGroupName names a tier's group of policies; the order is part of the identity, since
// it is the order they judge in.
func tierGroupName(tier TierName, dir Direction, chains []string) string {
	return string(tier) + "-grp-" + string(dir) + "-" + shortHash(strings.Join(chains, "\n"))
}
