package cluster

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// NamespaceNameLabel is set on every Namespace by the API server; policies commonly select on it.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// DefaultNamespace applies the API server's defaulting to a Namespace read from a file.
func DefaultNamespace(ns *corev1.Namespace) {
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[NamespaceNameLabel] = ns.Name
}

// DefaultPod applies the API server's (and kubelet's) defaulting that policy semantics depend on.
func DefaultPod(pod *corev1.Pod) {
	if pod.Namespace == "" {
		pod.Namespace = corev1.NamespaceDefault
	}
	if len(pod.Status.PodIPs) == 0 && pod.Status.PodIP != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			for j := range list[i].Ports {
				if list[i].Ports[j].Protocol == "" {
					list[i].Ports[j].Protocol = corev1.ProtocolTCP
				}
			}
		}
	}
}

// DefaultNetworkPolicy applies the API server's defaulting: policyTypes and port protocols.
func DefaultNetworkPolicy(np *networkingv1.NetworkPolicy) {
	if np.Namespace == "" {
		np.Namespace = corev1.NamespaceDefault
	}
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
