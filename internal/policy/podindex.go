package policy

import (
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netwarden/netwarden/internal/cluster"
)

// podInfo is a pod of the snapshot, and whether it is eligible: running or pending with IPs,
// not on the host network. The compiler holds one per pod of the cluster, so it keeps nothing
// the pod has.
type podInfo struct {
	pod      *cluster.Pod
	key      string
	eligible bool
}

// ips returns the addresses of an eligible pod.
func (pi *podInfo) ips() []netip.Addr { return pi.pod.IPs }

func (pi *podInfo) labels() labels.Set { return labels.Set(pi.pod.Labels) }

// podChange is a pod whose object differs from the previous snapshot; old or new is nil when
// the pod was not eligible (or did not exist) on that side.
type podChange struct {
	key      string
	old, new *podInfo
}

// diffPods brings the compiler's pod view up to st and returns what changed.
func (cc *Compiler) diffPods(st *cluster.State) []podChange {
	var changes []podChange
	seen := 0
	for key, pod := range st.Pods.All() {
		if prev := cc.pods[key]; prev != nil {
			seen++
			if prev.pod == pod {
				continue
			}
		}
		changes = cc.diffPod(changes, key, pod)
	}
	if seen < len(cc.pods) {
		for key := range cc.pods {
			if st.Pods.Get(key) == nil {
				changes = cc.diffPod(changes, key, nil)
			}
		}
	}
	// Deterministic order keeps set contents and logs reproducible.
	sort.Slice(changes, func(i, j int) bool { return changes[i].key < changes[j].key })
	return changes
}

// diffPodKeys is diffPods for a snapshot whose changed pod keys (sorted) are known.
func (cc *Compiler) diffPodKeys(st *cluster.State, keys []string) []podChange {
	var changes []podChange
	for _, key := range keys {
		pod := st.Pods.Get(key)
		if prev := cc.pods[key]; prev == nil && pod == nil || prev != nil && prev.pod == pod {
			continue
		}
		changes = cc.diffPod(changes, key, pod)
	}
	return changes
}

// diffPod records that key now maps to pod (nil: removed) and appends the change.
func (cc *Compiler) diffPod(changes []podChange, key string, pod *cluster.Pod) []podChange {
	var old, cur *podInfo
	if prev := cc.pods[key]; prev != nil && prev.eligible {
		old = prev
	}
	if pod == nil {
		delete(cc.pods, key)
	} else {
		pi := &podInfo{pod: pod, key: key, eligible: len(EligibleIPs(pod)) > 0}
		cc.pods[key] = pi
		if pi.eligible {
			cur = pi
		}
	}
	if old == nil && cur == nil {
		return changes
	}
	cc.setPod(key, old, cur)
	return append(changes, podChange{key: key, old: old, new: cur})
}

// impliedNamespacesChanged reports whether pod changes made a namespace without a Namespace
// object appear or disappear (see diffNamespaces).
func (cc *Compiler) impliedNamespacesChanged(st *cluster.State, changes []podChange) bool {
	for _, c := range changes {
		for _, pi := range [2]*podInfo{c.old, c.new} {
			if pi == nil {
				continue
			}
			ns := pi.pod.Namespace
			if _, ok := st.Namespaces[ns]; ok {
				continue
			}
			_, known := cc.nsLabels[ns]
			_, hasPods := cc.byNS[ns]
			if known != hasPods {
				return true
			}
		}
	}
	return false
}

// indexPolicies rebuilds the per-namespace index of st's policies.
func (cc *Compiler) indexPolicies(st *cluster.State) {
	cc.policyNS = map[string]map[string]*networkingv1.NetworkPolicy{}
	for key, np := range st.Policies {
		m := cc.policyNS[np.Namespace]
		if m == nil {
			m = map[string]*networkingv1.NetworkPolicy{}
			cc.policyNS[np.Namespace] = m
		}
		m[key] = np
	}
}

// updatePolicyKeys brings the per-namespace policy index up to st for the changed keys.
func (cc *Compiler) updatePolicyKeys(st *cluster.State, keys []string) {
	for _, key := range keys {
		ns, _, _ := strings.Cut(key, "/")
		cc.markNamespaceDirty(ns)
		np := st.Policies[key]
		m := cc.policyNS[ns]
		if np == nil {
			if m != nil {
				delete(m, key)
				if len(m) == 0 {
					delete(cc.policyNS, ns)
				}
			}
			continue
		}
		if m == nil {
			m = map[string]*networkingv1.NetworkPolicy{}
			cc.policyNS[ns] = m
		}
		m[key] = np
	}
}

func (cc *Compiler) setPod(key string, old, cur *podInfo) {
	if old != nil {
		delete(cc.local, key)
		removeFrom(cc.byNS, old.pod.Namespace, key)
	}
	if cur != nil {
		if cur.pod.NodeName == cc.node {
			cc.local[key] = cur
		}
		addTo(cc.byNS, cur.pod.Namespace, key, cur)
	}
}

func addTo(index map[string]map[string]*podInfo, group, key string, pi *podInfo) {
	m := index[group]
	if m == nil {
		m = map[string]*podInfo{}
		index[group] = m
	}
	m[key] = pi
}

func removeFrom(index map[string]map[string]*podInfo, group, key string) {
	if m := index[group]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(index, group)
		}
	}
}

// diffNamespaces refreshes namespace labels and reports whether any namespace appeared,
// disappeared or changed, including namespaces implied by pods alone.
func (cc *Compiler) diffNamespaces(st *cluster.State) bool {
	changed := len(st.Namespaces) != len(cc.nsPtr)
	if !changed {
		for name, ns := range st.Namespaces {
			if cc.nsPtr[name] != ns {
				changed = true
				break
			}
		}
	}
	implied := 0
	for ns := range cc.byNS {
		if _, ok := st.Namespaces[ns]; !ok {
			implied++
			if _, known := cc.nsLabels[ns]; !known {
				changed = true
			}
		}
	}
	if !changed && len(cc.nsLabels) == len(st.Namespaces)+implied {
		return false
	}
	cc.nsPtr = make(map[string]*corev1.Namespace, len(st.Namespaces))
	cc.nsLabels = make(map[string]labels.Set, len(st.Namespaces)+implied)
	for name, ns := range st.Namespaces {
		cc.nsPtr[name] = ns
		cc.nsLabels[name] = labels.Set(ns.Labels)
	}
	for ns := range cc.byNS {
		if _, ok := cc.nsLabels[ns]; !ok {
			// A pod proves its namespace exists even when the Namespace object is not (yet)
			// known, e.g. a manifests directory that declares no namespaces.
			cc.nsLabels[ns] = labels.Set{cluster.NamespaceNameLabel: ns}
		}
	}
	return true
}

// EligibleIPs returns the IPs of a pod that takes part in policy, or nil: pods without IPs, on
// the host network, or finished are neither targets nor peers. The result is the pod's own
// slice: it must not be modified.
func EligibleIPs(pod *cluster.Pod) []netip.Addr {
	if pod.HostNetwork || pod.Phase == corev1.PodSucceeded || pod.Phase == corev1.PodFailed || len(pod.IPs) == 0 {
		return nil
	}
	return pod.IPs
}

func labelsOf(m map[string]string) labels.Set { return labels.Set(m) }
