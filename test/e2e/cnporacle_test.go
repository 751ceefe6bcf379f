package e2e

// An oracle for ClusterNetworkPolicy (sigs.k8s.io/network-policy-api v0.3.0, v1beta1), written
// from the API's documentation (apis/v1beta1/clusternetworkpolicy_types.go), independently of the
// agent's compiler. It judges one connection per direction and names what decided it.
//
// The model, as the API documents it:
//
//   - Tiers are evaluated in order: Admin, then NetworkPolicy, then Baseline, then the default
//     (allow). Within a CNP tier, policies go by ascending spec.priority; policies of equal
//     priority go by name (the API leaves their order to the implementation; this agent orders by
//     name). Within a policy, the first rule that matches decides.
//   - Accept and Deny are final for the direction. Pass skips the rest of its tier: Admin passes
//     to NetworkPolicy, Baseline passes to the default.
//   - NetworkPolicy decides for a pod it isolates in that direction (allowed if one of the
//     policies selecting it allows); a pod no NetworkPolicy isolates goes on to the Baseline tier.
//   - Egress is judged at the source pod, ingress at the destination pod; a connection needs both.
//     An end that is not a pod (a node, a host-network pod, an outside address) has no policy of
//     its own in that direction.
//   - Subjects and the namespaces/pods peers select running pods that are not on the host
//     network. networks match any address (pod addresses too); nodes match the addresses
//     (InternalIP, ExternalIP) that the selected Nodes list in status.addresses.
//   - protocols: any entry matching is enough; none means all traffic. A destinationNamedPort is a
//     named container port of the destination pod; its protocol and number come from the pod.
//   - A peer with no field this agent knows (an empty peer, or one holding only domainNames) fails
//     closed: under Accept it matches nothing, under Deny and Pass it matches every peer (the
//     rule's protocols still apply).

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// cnpCluster is the cluster state an oracle judges: the API objects, by key ("ns/name" for
// namespaced kinds, the name otherwise).
type cnpCluster struct {
	Namespaces map[string]*corev1.Namespace
	Pods       map[string]*corev1.Pod
	Nodes      map[string]*corev1.Node
	NPs        map[string]*networkingv1.NetworkPolicy
	CNPs       map[string]*npav1beta1.ClusterNetworkPolicy
}

func newCNPCluster() *cnpCluster {
	return &cnpCluster{Namespaces: map[string]*corev1.Namespace{}, Pods: map[string]*corev1.Pod{},
		Nodes: map[string]*corev1.Node{}, NPs: map[string]*networkingv1.NetworkPolicy{},
		CNPs: map[string]*npav1beta1.ClusterNetworkPolicy{}}
}

// DeepCopy copies every object, so mutations of the copy never reach the original.
func (c *cnpCluster) DeepCopy() *cnpCluster {
	out := newCNPCluster()
	for k, v := range c.Namespaces {
		out.Namespaces[k] = v.DeepCopy()
	}
	for k, v := range c.Pods {
		out.Pods[k] = v.DeepCopy()
	}
	for k, v := range c.Nodes {
		out.Nodes[k] = v.DeepCopy()
	}
	for k, v := range c.NPs {
		out.NPs[k] = v.DeepCopy()
	}
	for k, v := range c.CNPs {
		out.CNPs[k] = v.DeepCopy()
	}
	return out
}

// cnpEligible reports whether a pod is a pod to policy: running (not finished), not on the host
// network, with an address. Other pods are neither subjects nor peers; their addresses are just
// addresses.
func cnpEligible(p *corev1.Pod) bool {
	if p == nil || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	return len(podAddrs(p)) > 0
}

// podAddrs lists a pod's addresses (status.podIPs, or status.podIP alone).
func podAddrs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a)
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// nodeAddrs lists the addresses a nodes peer matches: the InternalIP and ExternalIP entries of
// status.addresses.
func nodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// cnpDecision is the verdict of one direction and what decided it.
type cnpDecision struct {
	Allowed bool
	// Tier that decided: "Admin", "NetworkPolicy", "Baseline", or "" (the default, or no policy
	// applies in this direction because the end is not a pod).
	Tier string
	By   string   // the deciding object, readable
	Pass []string // the Pass rules that sent the connection on to a later tier
}

func (d cnpDecision) String() string {
	s := verdict(d.Allowed) + " by " + d.By
	if len(d.Pass) > 0 {
		s += " (after Pass: " + strings.Join(d.Pass, ", ") + ")"
	}
	return s
}

// cnpVerdict is the verdict of a connection: egress at the source, ingress at the destination.
type cnpVerdict struct {
	Egress, Ingress cnpDecision
}

func (v cnpVerdict) Allowed() bool { return v.Egress.Allowed && v.Ingress.Allowed }

func (v cnpVerdict) String() string {
	return fmt.Sprintf("%s (egress %s; ingress %s)", verdict(v.Allowed()), v.Egress, v.Ingress)
}

// cnpConn is one connection to judge: from an address (a pod's, or any other) to an address, a
// protocol and a destination port. Both ends are identified by address, as the dataplane sees them.
type cnpConn struct {
	SrcIP, DstIP netip.Addr
	Proto        corev1.Protocol
	Port         int
}

func (c cnpConn) String() string {
	return fmt.Sprintf("%s -> %s %s/%d", c.SrcIP, c.DstIP, c.Proto, c.Port)
}

// cnpOracle judges connections in one cluster state.
type cnpOracle struct {
	c               *cnpCluster
	admin, baseline []*npav1beta1.ClusterNetworkPolicy // in evaluation order
	np              *matcher.Policy                    // the NetworkPolicy layer (cyclonus)
	notInKeys       map[string]bool
	podByIP         map[netip.Addr]*corev1.Pod // eligible pods
}

func newCNPOracle(c *cnpCluster) *cnpOracle {
	o := &cnpOracle{c: c, podByIP: map[netip.Addr]*corev1.Pod{}}
	for _, k := range sortedKeys(c.Pods) {
		if p := c.Pods[k]; cnpEligible(p) {
			for _, ip := range podAddrs(p) {
				o.podByIP[ip] = p
			}
		}
	}
	for _, k := range sortedKeys(c.CNPs) {
		cnp := c.CNPs[k]
		switch cnp.Spec.Tier {
		case npav1beta1.AdminTier:
			o.admin = append(o.admin, cnp)
		case npav1beta1.BaselineTier:
			o.baseline = append(o.baseline, cnp)
		}
	}
	order := func(list []*npav1beta1.ClusterNetworkPolicy) {
		sort.SliceStable(list, func(i, j int) bool {
			if list[i].Spec.Priority != list[j].Spec.Priority {
				return list[i].Spec.Priority < list[j].Spec.Priority
			}
			return list[i].Name < list[j].Name
		})
	}
	order(o.admin)
	order(o.baseline)

	// The NetworkPolicy layer: cyclonus, fed the policies after the API server's defaulting
	// (its BuildTarget panics on empty policyTypes) and corrected for its NotIn deviation (see
	// withAbsentKeys in oracle_test.go).
	var nps []*networkingv1.NetworkPolicy
	for _, k := range sortedKeys(c.NPs) {
		np := c.NPs[k].DeepCopy()
		defaultNP(np)
		nps = append(nps, np)
	}
	o.notInKeys = notInKeys(nps)
	for _, np := range nps {
		rewriteForAbsentKeys(np, o.notInKeys)
	}
	o.np = matcher.BuildNetworkPolicies(false, nps)
	return o
}

// defaultNP applies the API server's defaulting of a NetworkPolicy: policyTypes (Ingress, and
// Egress when it has egress rules) and TCP for ports without a protocol.
func defaultNP(np *networkingv1.NetworkPolicy) {
	if len(np.Spec.PolicyTypes) == 0 {
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
	}
	tcp := corev1.ProtocolTCP
	for i := range np.Spec.Ingress {
		for j := range np.Spec.Ingress[i].Ports {
			if np.Spec.Ingress[i].Ports[j].Protocol == nil {
				np.Spec.Ingress[i].Ports[j].Protocol = &tcp
			}
		}
	}
	for i := range np.Spec.Egress {
		for j := range np.Spec.Egress[i].Ports {
			if np.Spec.Egress[i].Ports[j].Protocol == nil {
				np.Spec.Egress[i].Ports[j].Protocol = &tcp
			}
		}
	}
}

// podAt returns the eligible pod holding ip, or nil.
func (o *cnpOracle) podAt(ip netip.Addr) *corev1.Pod { return o.podByIP[ip] }

// Judge returns the verdict of a connection, per direction.
func (o *cnpOracle) Judge(c cnpConn) cnpVerdict {
	src, dst := o.podAt(c.SrcIP), o.podAt(c.DstIP)
	var v cnpVerdict
	if src == nil {
		v.Egress = cnpDecision{Allowed: true, By: "no egress policy: the source is not a pod"}
	} else {
		v.Egress = o.direction(false, src, src, dst, c)
	}
	if dst == nil {
		v.Ingress = cnpDecision{Allowed: true, By: "no ingress policy: the destination is not a pod"}
	} else {
		v.Ingress = o.direction(true, dst, src, dst, c)
	}
	return v
}

// direction judges one direction for subject (the source pod for egress, the destination pod
// for ingress). src is nil when the source is not a pod.
func (o *cnpOracle) direction(ingress bool, subject, src, dst *corev1.Pod, c cnpConn) cnpDecision {
	var passed []string
	if d, final, pass := o.tier(o.admin, ingress, subject, src, dst, c); final {
		return d
	} else if pass != "" {
		passed = append(passed, pass)
	}
	if isolated, allowed, by := o.networkPolicy(ingress, src, dst, c); isolated {
		return cnpDecision{Allowed: allowed, Tier: "NetworkPolicy", By: by, Pass: passed}
	}
	d, final, pass := o.tier(o.baseline, ingress, subject, src, dst, c)
	if final {
		d.Pass = passed
		return d
	}
	if pass != "" {
		passed = append(passed, pass)
	}
	return cnpDecision{Allowed: true, By: "the default: no policy decided", Pass: passed}
}

// tier walks the policies of one tier that select subject. It returns the decision when an
// Accept or Deny rule matched (final), or the Pass rule that ended the tier.
func (o *cnpOracle) tier(policies []*npav1beta1.ClusterNetworkPolicy, ingress bool, subject, src, dst *corev1.Pod, c cnpConn) (cnpDecision, bool, string) {
	dir := "egress"
	if ingress {
		dir = "ingress"
	}
	for _, cnp := range policies {
		if !o.subjectSelects(cnp.Spec.Subject, subject) {
			continue
		}
		type rule struct {
			name     string
			action   npav1beta1.ClusterNetworkPolicyRuleAction
			protos   []npav1beta1.ClusterNetworkPolicyProtocol
			peerFunc func(accept bool) bool
		}
		var rules []rule
		if ingress {
			for _, r := range cnp.Spec.Ingress {
				rules = append(rules, rule{r.Name, r.Action, r.Protocols, func(accept bool) bool {
					for _, p := range r.From {
						if o.ingressPeerMatches(p, accept, src) {
							return true
						}
					}
					return false
				}})
			}
		} else {
			for _, r := range cnp.Spec.Egress {
				rules = append(rules, rule{r.Name, r.Action, r.Protocols, func(accept bool) bool {
					for _, p := range r.To {
						if o.egressPeerMatches(p, accept, dst, c.DstIP) {
							return true
						}
					}
					return false
				}})
			}
		}
		for i, r := range rules {
			if !protocolsMatch(r.protos, dst, c) || !r.peerFunc(r.action == npav1beta1.ClusterNetworkPolicyRuleActionAccept) {
				continue
			}
			by := fmt.Sprintf("%s ClusterNetworkPolicy %s %s[%d] %q (%s)", cnp.Spec.Tier, cnp.Name, dir, i, r.name, r.action)
			switch r.action {
			case npav1beta1.ClusterNetworkPolicyRuleActionAccept:
				return cnpDecision{Allowed: true, Tier: string(cnp.Spec.Tier), By: by}, true, ""
			case npav1beta1.ClusterNetworkPolicyRuleActionPass:
				return cnpDecision{}, false, by
			default: // Deny; an action the API does not define is taken as Deny (fail closed)
				return cnpDecision{Allowed: false, Tier: string(cnp.Spec.Tier), By: by}, true, ""
			}
		}
	}
	return cnpDecision{}, false, ""
}

// networkPolicy returns whether NetworkPolicy isolates the subject of this direction and, if so,
// whether a policy selecting it allows the connection, with the policies that decided.
func (o *cnpOracle) networkPolicy(ingress bool, src, dst *corev1.Pod, c cnpConn) (isolated, allowed bool, by string) {
	portName := ""
	if dst != nil {
		for _, ctr := range dst.Spec.Containers {
			for _, cp := range ctr.Ports {
				if int(cp.ContainerPort) == c.Port && containerPortProto(cp) == c.Proto {
					portName = cp.Name
				}
			}
		}
	}
	tr := &matcher.Traffic{
		Source:           o.trafficPeer(src, c.SrcIP),
		Destination:      o.trafficPeer(dst, c.DstIP),
		ResolvedPort:     c.Port,
		ResolvedPortName: portName,
		Protocol:         c.Proto,
	}
	res := o.np.IsIngressOrEgressAllowed(tr, ingress)
	if len(res.AllowingTargets)+len(res.DenyingTargets) == 0 {
		return false, false, ""
	}
	names := func(targets []*matcher.Target) string {
		var out []string
		for _, t := range targets {
			for _, np := range t.SourceRules {
				out = append(out, np.Namespace+"/"+np.Name)
			}
		}
		sort.Strings(out)
		return strings.Join(slicesCompact(out), ", ")
	}
	if len(res.AllowingTargets) > 0 {
		return true, true, "NetworkPolicy " + names(res.AllowingTargets)
	}
	return true, false, "isolation by NetworkPolicy " + names(res.DenyingTargets) + " (no rule admits it)"
}

func slicesCompact(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// trafficPeer describes an end to cyclonus: a pod (with its labels and its namespace's), or a
// bare address.
func (o *cnpOracle) trafficPeer(p *corev1.Pod, ip netip.Addr) *matcher.TrafficPeer {
	if p == nil {
		return &matcher.TrafficPeer{IP: ip.String()}
	}
	return &matcher.TrafficPeer{IP: ip.String(), Internal: &matcher.InternalPeer{
		PodLabels:       withAbsentKeys(p.Labels, o.notInKeys),
		NamespaceLabels: withAbsentKeys(o.namespaceLabels(p.Namespace), o.notInKeys),
		Namespace:       p.Namespace,
	}}
}

// namespaceLabels returns a namespace's labels, with the kubernetes.io/metadata.name label the
// API server sets on every namespace.
func (o *cnpOracle) namespaceLabels(ns string) map[string]string {
	out := map[string]string{}
	if n, ok := o.c.Namespaces[ns]; ok {
		for k, v := range n.Labels {
			out[k] = v
		}
	}
	out[corev1.LabelMetadataName] = ns
	return out
}

// selects evaluates a label selector as the API server does (apimachinery's labels.Selector).
// A selector that does not parse selects nothing.
func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(labels.Set(set))
}

func (o *cnpOracle) podSelected(np *npav1beta1.NamespacedPod, p *corev1.Pod) bool {
	return selects(&np.NamespaceSelector, o.namespaceLabels(p.Namespace)) && selects(&np.PodSelector, p.Labels)
}

func (o *cnpOracle) subjectSelects(s npav1beta1.ClusterNetworkPolicySubject, p *corev1.Pod) bool {
	if !cnpEligible(p) {
		return false
	}
	switch {
	case s.Namespaces != nil:
		return selects(s.Namespaces, o.namespaceLabels(p.Namespace))
	case s.Pods != nil:
		return o.podSelected(s.Pods, p)
	}
	return false // a subject with no field selects nothing
}

// ingressPeerMatches: does an ingress peer match the source pod src (nil: not a pod)?
func (o *cnpOracle) ingressPeerMatches(p npav1beta1.ClusterNetworkPolicyIngressPeer, accept bool, src *corev1.Pod) bool {
	if p.Namespaces == nil && p.Pods == nil {
		return !accept // no known field: fail closed
	}
	if src == nil {
		return false
	}
	if p.Namespaces != nil && selects(p.Namespaces, o.namespaceLabels(src.Namespace)) {
		return true
	}
	return p.Pods != nil && o.podSelected(p.Pods, src)
}

// egressPeerMatches: does an egress peer match the destination (pod dst, nil if not a pod, at
// address ip)?
func (o *cnpOracle) egressPeerMatches(p npav1beta1.ClusterNetworkPolicyEgressPeer, accept bool, dst *corev1.Pod, ip netip.Addr) bool {
	if p.Namespaces == nil && p.Pods == nil && p.Nodes == nil && len(p.Networks) == 0 {
		return !accept // no known field (e.g. only domainNames): fail closed
	}
	if dst != nil && p.Namespaces != nil && selects(p.Namespaces, o.namespaceLabels(dst.Namespace)) {
		return true
	}
	if dst != nil && p.Pods != nil && o.podSelected(p.Pods, dst) {
		return true
	}
	for _, cidr := range p.Networks {
		if pfx, err := netip.ParsePrefix(string(cidr)); err == nil && pfx.Contains(ip) {
			return true
		}
	}
	if p.Nodes != nil {
		for _, k := range sortedKeys(o.c.Nodes) {
			n := o.c.Nodes[k]
			if !selects(p.Nodes, n.Labels) {
				continue
			}
			for _, a := range nodeAddrs(n) {
				if a == ip {
					return true
				}
			}
		}
	}
	return false
}

func containerPortProto(cp corev1.ContainerPort) corev1.Protocol {
	if cp.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return cp.Protocol
}

// protocolsMatch: does the connection match a rule's protocols? dst is the destination pod (nil
// if the destination is not a pod), where named ports are resolved.
func protocolsMatch(protos []npav1beta1.ClusterNetworkPolicyProtocol, dst *corev1.Pod, c cnpConn) bool {
	if len(protos) == 0 {
		return true
	}
	portMatches := func(p *npav1beta1.Port) bool {
		switch {
		case p == nil:
			return true // a protocol with no port: every port of it
		case p.Range != nil:
			return int(p.Range.Start) <= c.Port && c.Port <= int(p.Range.End)
		default:
			return int(p.Number) == c.Port
		}
	}
	for _, p := range protos {
		if p.TCP != nil && c.Proto == corev1.ProtocolTCP && portMatches(p.TCP.DestinationPort) {
			return true
		}
		if p.UDP != nil && c.Proto == corev1.ProtocolUDP && portMatches(p.UDP.DestinationPort) {
			return true
		}
		if p.SCTP != nil && c.Proto == corev1.ProtocolSCTP && portMatches(p.SCTP.DestinationPort) {
			return true
		}
		if p.DestinationNamedPort != "" && dst != nil {
			for _, ctr := range dst.Spec.Containers {
				for _, cp := range ctr.Ports {
					if cp.Name == p.DestinationNamedPort && containerPortProto(cp) == c.Proto && int(cp.ContainerPort) == c.Port {
						return true
					}
				}
			}
		}
	}
	return false
}
