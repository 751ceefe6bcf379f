package lint

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// view answers which objects of a state a selector matches, as the policy model counts them:
// pods NetworkPolicy applies to (not host network, not finished), with or without an address.
type view struct {
	st   *cluster.State
	pods []*cluster.Pod // sorted by key
}

func newView(st *cluster.State) *view {
	v := &view{st: st}
	for _, k := range slices.Sorted(st.Pods.Keys()) {
		p := st.Pods.Get(k)
		if !p.HostNetwork && p.Phase != corev1.PodSucceeded && p.Phase != corev1.PodFailed {
			v.pods = append(v.pods, p)
		}
	}
	return v
}

func selector(ls *metav1.LabelSelector) labels.Selector {
	if ls == nil {
		return labels.Everything()
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return labels.Nothing()
	}
	return s
}

// namespaceMatches reports whether namespace ns matches nsSel (nil: only inNS when set, else any).
func (v *view) namespaceMatches(ns string, nsSel *metav1.LabelSelector, inNS string) bool {
	if nsSel == nil {
		return inNS == "" || ns == inNS
	}
	set := labels.Set{cluster.NamespaceNameLabel: ns} // what the agent gives a namespace it has no object of
	if n := v.st.Namespaces[ns]; n != nil {
		set = n.Labels
	}
	return selector(nsSel).Matches(set)
}

// pods lists the pods that nsSel and podSel match together; a nil nsSel means namespace inNS
// (or every namespace when inNS is ""), a nil podSel every pod.
func (v *view) matching(nsSel, podSel *metav1.LabelSelector, inNS string) []*cluster.Pod {
	var out []*cluster.Pod
	ps := selector(podSel)
	for _, p := range v.pods {
		if v.namespaceMatches(p.Namespace, nsSel, inNS) && ps.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

// npPeerPods lists the pods a NetworkPolicy peer of namespace ns matches (nil for an ipBlock).
func (v *view) npPeerPods(ns string, nsSel, podSel *metav1.LabelSelector) []*cluster.Pod {
	if nsSel == nil {
		return v.matching(nil, podSel, ns)
	}
	return v.matching(nsSel, podSel, "")
}

// subjectPods lists the pods a ClusterNetworkPolicy's subject selects.
func (v *view) subjectPods(s npav1beta1.ClusterNetworkPolicySubject) []*cluster.Pod {
	if s.Namespaces != nil {
		return v.matching(s.Namespaces, nil, "")
	}
	if s.Pods != nil {
		return v.matching(&s.Pods.NamespaceSelector, &s.Pods.PodSelector, "")
	}
	return nil
}

// cnpPeerPods lists the pods a ClusterNetworkPolicy pod or namespace peer selects.
func (v *view) cnpPeerPods(namespaces *metav1.LabelSelector, pods *npav1beta1.NamespacedPod) []*cluster.Pod {
	if namespaces != nil {
		return v.matching(namespaces, nil, "")
	}
	if pods != nil {
		return v.matching(&pods.NamespaceSelector, &pods.PodSelector, "")
	}
	return nil
}

// nodes lists the names of the Nodes sel matches.
func (v *view) nodes(sel *metav1.LabelSelector) []string {
	var out []string
	s := selector(sel)
	for _, k := range sortedKeys(v.st.Nodes) {
		if s.Matches(labels.Set(v.st.Nodes[k].Labels)) {
			out = append(out, k)
		}
	}
	return out
}

// hasNamedPort reports whether some pod of pods has a container port named name (of protocol
// proto, when set).
func hasNamedPort(pods []*cluster.Pod, name string, proto corev1.Protocol) bool {
	return slices.ContainsFunc(pods, func(p *cluster.Pod) bool {
		for _, cp := range p.Ports {
			if cp.Name == name && (proto == "" || cp.Protocol == proto || cp.Protocol == "" && proto == corev1.ProtocolTCP) {
				return true
			}
		}
		return false
	})
}

// sortedKeys returns a map's keys in order, so that findings come out the same each run.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
