// Package cluster holds the agent's view of cluster state: the Kubernetes objects that NetworkPolicy
// enforcement depends on, the defaulting and validation applied to them, and the Source interface that
// the API and manifest readers implement.
package cluster

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// State is an immutable snapshot of the objects the agent uses. Maps are keyed by name for
// cluster-scoped objects and by "namespace/name" for namespaced ones. Consumers must not mutate
// the objects; sources hand out shared pointers to keep snapshots cheap at thousands of pods.
type State struct {
	Namespaces map[string]*corev1.Namespace
	Pods       map[string]*corev1.Pod
	Policies   map[string]*networkingv1.NetworkPolicy
	Nodes      map[string]*corev1.Node
}

// NewState returns an empty state with all maps allocated.
func NewState() *State {
	return &State{
		Namespaces: map[string]*corev1.Namespace{},
		Pods:       map[string]*corev1.Pod{},
		Policies:   map[string]*networkingv1.NetworkPolicy{},
		Nodes:      map[string]*corev1.Node{},
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
	// Nodes returns the current valid Nodes by name. The result is never mutated afterwards.
	Nodes() map[string]*corev1.Node
}

// Clone returns a new State sharing every object with s, as a source's next snapshot does.
func (s *State) Clone() *State {
	out := &State{
		Namespaces: make(map[string]*corev1.Namespace, len(s.Namespaces)),
		Pods:       make(map[string]*corev1.Pod, len(s.Pods)),
		Policies:   make(map[string]*networkingv1.NetworkPolicy, len(s.Policies)),
		Nodes:      make(map[string]*corev1.Node, len(s.Nodes)),
	}
	for k, v := range s.Namespaces {
		out.Namespaces[k] = v
	}
	for k, v := range s.Pods {
		out.Pods[k] = v
	}
	for k, v := range s.Policies {
		out.Policies[k] = v
	}
	for k, v := range s.Nodes {
		out.Nodes[k] = v
	}
	return out
}
