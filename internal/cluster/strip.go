package cluster

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Strip functions return a new object that keeps only what the agent reads of an object, so
// that sources holding thousands of objects hold no more than that (both sources use them: the
// API source on what its informers receive, the manifests source on what it decoded):
//
//   - metadata: name, namespace, labels, resourceVersion and uid;
//   - Namespace: metadata only;
//   - Pod: spec.nodeName, spec.hostNetwork, the ports (name, containerPort, protocol) of containers
//     and init containers (and nothing else of them), status.phase, status.podIP and status.podIPs; what the agent keeps of it
//     is a Pod (Interner.Pod), made of the stripped pod once defaulted and validated;
//   - Node: spec.podCIDRs and status.addresses;
//   - NetworkPolicy: spec.
//
// The result shares read-only parts with the input (labels map, podCIDRs, addresses, a
// NetworkPolicy's spec): the input must not be changed afterwards. Nothing is defaulted.
//
// The methods of the same names on an Interner also share equal parts between their results
// (see Interner), which must then not be changed either, not even defaulted: they are for
// objects defaulted before they are stripped.

// StripMeta keeps name, namespace, labels (shared), resourceVersion and uid.
func StripMeta(m *metav1.ObjectMeta) metav1.ObjectMeta { return (*Interner)(nil).StripMeta(m) }

// StripPod returns what the agent reads of pod, in a corev1.Pod of its own (the ports copied) that
// DefaultPod and ValidatePod can work on before Interner.Pod keeps what is needed of it.
func StripPod(pod *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		ObjectMeta: StripMeta(&pod.ObjectMeta),
		Spec: corev1.PodSpec{
			NodeName:       pod.Spec.NodeName,
			HostNetwork:    pod.Spec.HostNetwork,
			InitContainers: containerPorts(pod.Spec.InitContainers),
			Containers:     containerPorts(pod.Spec.Containers),
		},
		Status: corev1.PodStatus{
			Phase: pod.Status.Phase,
			PodIP: pod.Status.PodIP,
		},
	}
	if len(pod.Status.PodIPs) > 0 {
		out.Status.PodIPs = append([]corev1.PodIP(nil), pod.Status.PodIPs...) // exact size
	}
	return out
}

// containerPorts keeps, of each container, only the ports' name, number and protocol; nil when no
// container has ports. The containers keep their places, for validation to name.
func containerPorts(containers []corev1.Container) []corev1.Container {
	if !slices.ContainsFunc(containers, func(c corev1.Container) bool { return len(c.Ports) > 0 }) {
		return nil
	}
	out := make([]corev1.Container, len(containers))
	for i := range containers {
		if len(containers[i].Ports) == 0 {
			continue
		}
		ports := make([]corev1.ContainerPort, len(containers[i].Ports))
		for j, p := range containers[i].Ports {
			ports[j] = corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol}
		}
		out[i] = corev1.Container{Ports: ports}
	}
	return out
}

// StripNamespace returns what the agent reads of ns: its metadata.
func StripNamespace(ns *corev1.Namespace) *corev1.Namespace {
	return (*Interner)(nil).StripNamespace(ns)
}

// StripNode returns what the agent reads of node.
func StripNode(node *corev1.Node) *corev1.Node { return (*Interner)(nil).StripNode(node) }

// StripNetworkPolicy returns what the agent reads of np: its metadata and spec (shared).
func StripNetworkPolicy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	return (*Interner)(nil).StripNetworkPolicy(np)
}

// StripMeta is cluster.StripMeta, with the labels interned.
func (in *Interner) StripMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            m.Name,
		Namespace:       m.Namespace,
		Labels:          in.Labels(m.Labels),
		Annotations:     KeptAnnotations(m.Annotations),
		ResourceVersion: m.ResourceVersion,
		UID:             m.UID,
	}
}

// StagedAnnotation marks a NetworkPolicy or ClusterNetworkPolicy as staged when "true": it
// changes no verdict (see policy.IsStaged).
const StagedAnnotation = "netwarden.io/staged"

var stagedTrue = map[string]string{StagedAnnotation: "true"}

// KeptAnnotations returns the annotations the agent reads (only StagedAnnotation) out of a,
// nil when there are none; the common one is one map shared by every object, which, like every
// object of a snapshot, is never modified.
func KeptAnnotations(a map[string]string) map[string]string {
	v, ok := a[StagedAnnotation]
	switch {
	case !ok:
		return nil
	case v == "true":
		return stagedTrue
	}
	return map[string]string{StagedAnnotation: v}
}

// StripNamespace is cluster.StripNamespace, with the labels interned.
func (in *Interner) StripNamespace(ns *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: in.StripMeta(&ns.ObjectMeta)}
}

// StripNode is cluster.StripNode, with the labels interned.
func (in *Interner) StripNode(node *corev1.Node) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: in.StripMeta(&node.ObjectMeta),
		Spec:       corev1.NodeSpec{PodCIDRs: node.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: node.Status.Addresses},
	}
}

// StripNetworkPolicy is cluster.StripNetworkPolicy, with the labels and the selectors' matchLabels
// interned. The rules are copied (to hold the interned selectors without writing into np), and
// share their ports and matchExpressions with np.
func (in *Interner) StripNetworkPolicy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	out := &networkingv1.NetworkPolicy{ObjectMeta: in.StripMeta(&np.ObjectMeta), Spec: np.Spec}
	if in == nil {
		return out
	}
	out.Spec.PodSelector.MatchLabels = in.Labels(np.Spec.PodSelector.MatchLabels)
	if rules := np.Spec.Ingress; rules != nil {
		out.Spec.Ingress = make([]networkingv1.NetworkPolicyIngressRule, len(rules))
		for i, r := range rules {
			r.From = in.peers(r.From)
			out.Spec.Ingress[i] = r
		}
	}
	if rules := np.Spec.Egress; rules != nil {
		out.Spec.Egress = make([]networkingv1.NetworkPolicyEgressRule, len(rules))
		for i, r := range rules {
			r.To = in.peers(r.To)
			out.Spec.Egress[i] = r
		}
	}
	return out
}

// peers returns a copy of peers with their selectors' matchLabels interned.
func (in *Interner) peers(peers []networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer {
	if peers == nil {
		return nil
	}
	out := make([]networkingv1.NetworkPolicyPeer, len(peers))
	for i, p := range peers {
		p.PodSelector = in.selector(p.PodSelector)
		p.NamespaceSelector = in.selector(p.NamespaceSelector)
		out[i] = p
	}
	return out
}

func (in *Interner) selector(s *metav1.LabelSelector) *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	c := *s
	c.MatchLabels = in.Labels(s.MatchLabels)
	return &c
}
