package kubeapi

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Transform is the cache.TransformFunc installed on every informer. It replaces each object with a
// new one that keeps only what the agent uses (a cluster.Pod for a pod, the cluster.Strip
// functions for the others), and applies the cluster defaulting to it, so that the informer caches stay small and Snapshot can share their
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

// interner shares the equal parts of the pods every informer of the process keeps (labels,
// ports, namespace and node names): thousands of pods repeat a few of each.
var interner = cluster.NewInterner()

// TransformPod returns what the agent keeps of pod (a *cluster.Pod), defaulted, or, when pod is
// not valid, an *invalidObject that says why: validation needs what the agent does not keep.
func TransformPod(pod *corev1.Pod) metav1.Object {
	c := cluster.StripPod(pod) // a copy for the defaulting to write into; garbage afterwards
	cluster.DefaultPod(c)
	out := interner.Pod(c)
	if errs := cluster.ValidatePod(c); len(errs) > 0 {
		return &invalidObject{Object: out, errs: errs}
	}
	return out
}

// invalidObject stands, in an informer's store, for an object that Transform found invalid; the
// event handlers log it and keep nothing of it.
type invalidObject struct {
	metav1.Object
	errs field.ErrorList
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
