package cluster

import (
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
//     and init containers (containers without ports are dropped, and so are container names,
//     images...), status.phase, status.podIP and status.podIPs;
//   - Node: spec.podCIDRs and status.addresses;
//   - NetworkPolicy: spec.
//
// The result shares read-only parts with the input (labels map, podCIDRs, addresses, a
// NetworkPolicy's spec): the input must not be changed afterwards. Nothing is defaulted.

// StripMeta keeps name, namespace, labels (shared), resourceVersion and uid.
func StripMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            m.Name,
		Namespace:       m.Namespace,
		Labels:          m.Labels,
		ResourceVersion: m.ResourceVersion,
		UID:             m.UID,
	}
}

// StripPod returns what the agent reads of pod.
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

// containerPorts keeps, for each container that has ports, only the ports' name, number and
// protocol. It returns nil when no container has ports.
func containerPorts(containers []corev1.Container) []corev1.Container {
	n := 0
	for i := range containers {
		if len(containers[i].Ports) > 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]corev1.Container, 0, n)
	for i := range containers {
		if len(containers[i].Ports) == 0 {
			continue
		}
		ports := make([]corev1.ContainerPort, len(containers[i].Ports))
		for j, p := range containers[i].Ports {
			ports[j] = corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol}
		}
		out = append(out, corev1.Container{Ports: ports})
	}
	return out
}

// StripNamespace returns what the agent reads of ns: its metadata.
func StripNamespace(ns *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: StripMeta(&ns.ObjectMeta)}
}

// StripNode returns what the agent reads of node.
func StripNode(node *corev1.Node) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: StripMeta(&node.ObjectMeta),
		Spec:       corev1.NodeSpec{PodCIDRs: node.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: node.Status.Addresses},
	}
}

// StripNetworkPolicy returns what the agent reads of np: its metadata and spec (shared).
func StripNetworkPolicy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: StripMeta(&np.ObjectMeta), Spec: np.Spec}
}
