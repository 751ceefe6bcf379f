// Package cluster holds the agent's view of cluster state: the Kubernetes objects that NetworkPolicy
// enforcement depends on, the defaulting and validation applied to them, and the Source interface that
// the API and manifest readers implement.
package cluster

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// State is an immutable snapshot of the objects the agent uses. Maps are keyed by name for
// cluster-scoped objects and by "namespace/name" for namespaced ones; the pods are a PodMap,
// whose snapshots share most of their parts. Consumers must not mutate
// the objects; sources hand out shared pointers to keep snapshots cheap at thousands of pods.
type State struct {
	Namespaces map[string]*corev1.Namespace
	Pods       *PodMap
	Policies   map[string]*networkingv1.NetworkPolicy
	Nodes      map[string]*corev1.Node
	// ClusterPolicies holds the ClusterNetworkPolicies (policy.networking.k8s.io, both tiers)
	// by name. Sources convert every served version to v1beta1.
	ClusterPolicies map[string]*npav1beta1.ClusterNetworkPolicy

	// Generation numbers the snapshots of a Tracker; 0 means unnumbered. Numbers are unique
	// within the process, so a consumer fed by two trackers is never misled.
	Generation uint64
	// Revision says which writes of the source this snapshot contains.
	Revision Revision
	// Changes, when set, lets a consumer that processed the snapshot numbered Changes.Since
	// look only at the keys listed instead of walking every map. It is a hint: the state is
	// complete without it, and a consumer that did not see Since ignores it.
	Changes *Changes
}

// Changes lists the keys, per map, whose entries may differ from those of an earlier
// snapshot. Every key not listed maps to the same object pointer in both snapshots.
type Changes struct {
	Since                                              uint64
	Namespaces, Pods, Policies, Nodes, ClusterPolicies []string
}

// NewState returns an empty state with all maps allocated.
func NewState() *State {
	return &State{
		Namespaces: map[string]*corev1.Namespace{},
		Pods:       &PodMap{},
		Policies:   map[string]*networkingv1.NetworkPolicy{},
		Nodes:      map[string]*corev1.Node{},

		ClusterPolicies: map[string]*npav1beta1.ClusterNetworkPolicy{},
	}
}

// Key returns the map key used for a namespaced object.
func Key(namespace, name string) string { return namespace + "/" + name }

// Source delivers cluster state. Implementations: the Kubernetes API (shared informers) and a
// directory of manifests.
type Source interface {
	// Run starts watching and blocks until ctx is done or the source fails irrecoverably.
	// notify is called (it must not block) after every change to the state.
	Run(ctx context.Context, notify func()) error
	// HasSynced reports whether the initial state is complete. Before that, the agent must not
	// program the kernel: a partial view would open or break traffic.
	HasSynced() bool
	// Snapshot returns the current state. The result is never mutated afterwards.
	Snapshot() *State
}

// NodeLister is implemented by sources that can hand out the Nodes alone, much more cheaply
// than a whole Snapshot: the masquerade loop, which reads only Nodes, runs on every event.
type NodeLister interface {
	// Nodes returns the current valid Nodes by name, and the Revision of the source they are
	// current at. The result is never mutated afterwards.
	Nodes() (map[string]*corev1.Node, Revision)
}

// Clone returns a new, unnumbered State sharing every object with s.
func (s *State) Clone() *State {
	// maps.Clone copies the hash table as it is, several times faster than re-inserting.
	return &State{
		Namespaces: cloneMap(s.Namespaces),
		Pods:       s.Pods.Clone(),
		Policies:   cloneMap(s.Policies),
		Nodes:      cloneMap(s.Nodes),

		ClusterPolicies: cloneMap(s.ClusterPolicies),
		Revision:        s.Revision,
	}
}

// cloneMap is maps.Clone, except that a nil map comes back empty and writable.
func cloneMap[T any](m map[string]*T) map[string]*T {
	if m == nil {
		return map[string]*T{}
	}
	return maps.Clone(m)
}
