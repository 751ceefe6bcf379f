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

// podInfo is an eligible pod: running or pending with IPs, not on the host network.
type podInfo struct {
	pod    *corev1.Pod
	key    string
	ips    []netip.Addr
	labels labels.Set
}

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
	for key, pod := range st.Pods {
		prev, existed := cc.podPtr[key]
		if existed {
			seen++
			if prev == pod {
				continue
			}
		}
		changes = cc.diffPod(changes, key, pod)
	}
	if seen < len(cc.podPtr) {
		for key := range cc.podPtr {
			if _, ok := st.Pods[key]; !ok {
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
		pod := st.Pods[key]
		if prev, existed := cc.podPtr[key]; prev == pod && (existed || pod == nil) {
			continue
		}
		changes = cc.diffPod(changes, key, pod)
	}
	return changes
}

// diffPod records that key now maps to pod (nil: removed) and appends the change.
func (cc *Compiler) diffPod(changes []podChange, key string, pod *corev1.Pod) []podChange {
	if pod == nil {
		delete(cc.podPtr, key)
	} else {
		cc.podPtr[key] = pod
	}
	old := cc.pods[key]
	var cur *podInfo
	if pod != nil {
		if ips := EligibleIPs(pod); len(ips) > 0 {
			cur = &podInfo{pod: pod, key: key, ips: ips, labels: labels.Set(pod.Labels)}
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
		delete(cc.pods, key)
		delete(cc.local, key)
		removeFrom(cc.byNS, old.pod.Namespace, key)
		for _, name := range portNames(old.pod) {
			removeFrom(cc.byPort, name, key)
		}
	}
	if cur != nil {
		cc.pods[key] = cur
		if cur.pod.Spec.NodeName == cc.node {
			cc.local[key] = cur
		}
		addTo(cc.byNS, cur.pod.Namespace, key, cur)
		for _, name := range portNames(cur.pod) {
			addTo(cc.byPort, name, key, cur)
		}
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

func portNames(pod *corev1.Pod) []string {
	var names []string
	for _, ctr := range pod.Spec.Containers {
		for _, cp := range ctr.Ports {
			if cp.Name != "" {
				names = append(names, cp.Name)
			}
		}
	}
	return names
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
// the host network, or finished are neither targets nor peers.
func EligibleIPs(pod *corev1.Pod) []netip.Addr {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var ips []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		ips = append(ips, a.Unmap())
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	return ips
}

func labelsOf(m map[string]string) labels.Set { return labels.Set(m) }
