package lint

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
)

// checkNetworkPolicies finds, in each NetworkPolicy, selectors that match no pod today, named
// ports no pod has, and ipBlock excepts outside their block.
func checkNetworkPolicies(r *Report, v *view) {
	for _, key := range sortedKeys(v.st.Policies) {
		np := v.st.Policies[key]
		obj := "NetworkPolicy " + key
		selected := v.matching(nil, &np.Spec.PodSelector, np.Namespace)
		if len(selected) == 0 {
			r.add(Finding{Severity: Warning, Check: "selects-nothing", Object: obj, Field: "spec.podSelector",
				Problem: fmt.Sprintf("selects no pod of namespace %s today", np.Namespace),
				Why:     "a label typo is the usual cause: the policy then protects nothing, and isolates nothing",
				Fix:     "match the labels of the pods it is meant for (kubectl get pods -n " + np.Namespace + " --show-labels)"})
		}
		for i, rule := range np.Spec.Ingress {
			field := fmt.Sprintf("spec.ingress[%d]", i)
			checkNPPeers(r, v, obj, field+".from", np.Namespace, rule.From)
			checkNPPorts(r, obj, field, rule.Ports, selected, "the pods the policy selects")
		}
		for i, rule := range np.Spec.Egress {
			field := fmt.Sprintf("spec.egress[%d]", i)
			peerPods := checkNPPeers(r, v, obj, field+".to", np.Namespace, rule.To)
			if len(rule.To) == 0 {
				peerPods = v.pods
			}
			// An ipBlock admits the named port of any pod whose address it holds: left alone.
			if !slices.ContainsFunc(rule.To, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil }) {
				checkNPPorts(r, obj, field, rule.Ports, peerPods, "the pods this rule admits")
			}
		}
	}
}

// checkNPPeers checks one rule's peers and returns the pods they match together.
func checkNPPeers(r *Report, v *view, obj, field, ns string, peers []networkingv1.NetworkPolicyPeer) []*cluster.Pod {
	var all []*cluster.Pod
	for j, p := range peers {
		f := fmt.Sprintf("%s[%d]", field, j)
		if b := p.IPBlock; b != nil {
			checkIPBlock(r, obj, f+".ipBlock", b)
			continue
		}
		pods := v.npPeerPods(ns, p.NamespaceSelector, p.PodSelector)
		if len(pods) == 0 {
			r.add(Finding{Severity: Warning, Check: "selects-nothing", Object: obj, Field: f,
				Problem: "matches no pod today",
				Why:     "a label typo in a peer admits nothing, and the traffic it was written for is denied",
				Fix:     "match the labels of the pods (and namespaces) it is meant to admit"})
		}
		all = append(all, pods...)
	}
	return all
}

// checkNPPorts finds named ports that none of pods has.
func checkNPPorts(r *Report, obj, field string, ports []networkingv1.NetworkPolicyPort, pods []*cluster.Pod, whose string) {
	for k, p := range ports {
		if p.Port == nil || p.Port.Type != intstr.String {
			continue
		}
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if !hasNamedPort(pods, p.Port.StrVal, proto) {
			r.add(Finding{Severity: Warning, Check: "named-port", Object: obj, Field: fmt.Sprintf("%s.ports[%d]", field, k),
				Problem: fmt.Sprintf("names port %q (%s), which none of %s has", p.Port.StrVal, proto, whose),
				Why:     "a named port matches only containers that declare it: this rule admits nothing today",
				Fix:     "use the name a container port of those pods has, or the port number"})
		}
	}
}

// checkIPBlock finds excepts that lie outside their block.
func checkIPBlock(r *Report, obj, field string, b *networkingv1.IPBlock) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return // the sources reject it first
	}
	for k, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			continue
		}
		if ex.Bits() < cidr.Bits() || !cidr.Contains(ex.Addr()) {
			r.add(Finding{Severity: Error, Check: "ipblock-except", Object: obj, Field: fmt.Sprintf("%s.except[%d]", field, k),
				Problem: fmt.Sprintf("except %s lies outside cidr %s", e, b.CIDR),
				Why:     "it excepts nothing: the addresses it was meant to keep out are admitted with the rest of the block",
				Fix:     fmt.Sprintf("give an except inside %s, or widen the cidr", b.CIDR)})
		}
	}
}
