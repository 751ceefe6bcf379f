package kubeapi

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Transform is the cache.TransformFunc installed on every informer. It replaces each object with a
// new one that keeps only what the agent uses (the cluster.Strip functions), and applies the
// cluster defaulting to it, so that the informer caches stay small and Snapshot can share their
// objects as they are. A ClusterNetworkPolicy keeps its metadata (with metadata.generation), spec
// and status.conditions (read by the conditions writer, which needs them all to patch its own
// without losing the others').
//
// Tombstones (cache.DeletedFinalStateUnknown) are transformed inside. Other types pass unchanged.
// Transform is idempotent, as client-go requires. The input is not modified, but the result shares
// some read-only parts with it (labels map, podCIDRs, addresses).
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return TransformPod(o), nil
	case *networkingv1.NetworkPolicy:
		return TransformNetworkPolicy(o), nil
	case *corev1.Namespace:
		return TransformNamespace(o), nil
	case *corev1.Node:
		return TransformNode(o), nil
	case *npav1beta1.ClusterNetworkPolicy:
		return TransformClusterNetworkPolicy(o), nil
	case cache.DeletedFinalStateUnknown:
		inner, err := Transform(o.Obj)
		if err != nil {
			return nil, err
		}
		return cache.DeletedFinalStateUnknown{Key: o.Key, Obj: inner}, nil
	case *cache.DeletedFinalStateUnknown:
		inner, err := Transform(o.Obj)
		if err != nil {
			return nil, err
		}
		return &cache.DeletedFinalStateUnknown{Key: o.Key, Obj: inner}, nil
	}
	return obj, nil
}

// TransformPod returns a copy of pod stripped to what the agent uses, defaulted.
func TransformPod(pod *corev1.Pod) *corev1.Pod {
	out := cluster.StripPod(pod)
	cluster.DefaultPod(out)
	return out
}

// TransformNamespace returns a copy of ns with metadata only, defaulted.
func TransformNamespace(ns *corev1.Namespace) *corev1.Namespace {
	out := cluster.StripNamespace(ns)
	if out.Labels[cluster.NamespaceNameLabel] != out.Name {
		// Set by the API server since 1.21; only missing on objects from old or fake servers.
		labels := make(map[string]string, len(out.Labels)+1)
		for k, v := range out.Labels {
			labels[k] = v
		}
		out.Labels = labels
		cluster.DefaultNamespace(out)
	}
	return out
}

// TransformNode returns a copy of node with spec.podCIDRs and status.addresses only.
func TransformNode(node *corev1.Node) *corev1.Node {
	return cluster.StripNode(node)
}

// TransformClusterNetworkPolicy returns a copy of cnp with metadata, spec and status conditions
// only. The spec is shared with the input: nothing defaults it.
func TransformClusterNetworkPolicy(cnp *npav1beta1.ClusterNetworkPolicy) *npav1beta1.ClusterNetworkPolicy {
	out := &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: cluster.StripMeta(&cnp.ObjectMeta),
		Spec:       cnp.Spec,
		Status:     npav1beta1.ClusterNetworkPolicyStatus{Conditions: cnp.Status.Conditions},
	}
	// The conditions writer reports the generation it judged.
	out.Generation = cnp.Generation
	return out
}

// TransformNetworkPolicy returns a copy of np with metadata and spec only, defaulted.
func TransformNetworkPolicy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	out := cluster.StripNetworkPolicy(np)
	out.Spec = *np.Spec.DeepCopy() // defaulting must not write into the input
	cluster.DefaultNetworkPolicy(out)
	return out
}
