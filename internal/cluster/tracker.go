package cluster

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// generations numbers snapshots across every Tracker of the process.
var generations atomic.Uint64

// Tracker holds the current objects of a source, changed one at a time as events arrive,
// and hands out immutable snapshots that say which keys changed since the previous one. A
// snapshot costs a copy of the hash tables of the kinds that changed, not a walk over the
// objects (the pods, which may number 150,000, are a PodMap, of which a change after a snapshot
// copies one shard), and lets the policy compiler work in proportion to the change. Safe for
// concurrent use.
type Tracker struct {
	mu    sync.Mutex
	cur   State
	dirty [5]map[string]struct{} // keys changed since last, per kind
	// shared marks the maps of cur that last also holds; they are copied before the next
	// change (copy on write), so a snapshot copies only the kinds that changed.
	shared [5]bool
	last   *State
	// revisionChanged: the Revision moved without any object changing (an update of fields
	// the agent does not keep). It still makes a new snapshot, so that a writer waiting for
	// its write to be applied sees it applied.
	revisionChanged bool
	// rvShared marks cur.Revision's ResourceVersions as also held by a snapshot (copy on
	// write), so that a published Revision never changes.
	rvShared bool
	// pendingFiles holds the file hashes set since cur.Revision.Files was last published;
	// publishing makes a new FileHashes of them, which shares the bulk with the old.
	pendingFiles map[string]string

	// spare holds, per kind (pods aside), a copy of cur's map made in the background after a
	// snapshot shared it, so that the next change of that kind takes the copy instead of making it
	// then: at thousands of objects the copy costs a change a few hundred microseconds. A
	// spare is for the map of mapGen[kind] it was made of; a map replaced since leaves it
	// unused.
	spare  [5]spareMap
	mapGen [5]uint64
	// preparing is set while a goroutine makes spares; prepared is called after each of its
	// runs (tests wait for it).
	preparing bool
	prepared  func()
}

// spareMap is a copy of the map of kind generation gen, made ahead of its next change.
type spareMap struct {
	gen uint64
	m   any // map[string]*T of the kind
}

// Kinds of object a Tracker holds, indexing Tracker.dirty.
const (
	kindNamespace = iota
	kindPod
	kindPolicy
	kindNode
	kindClusterPolicy
)

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	t := &Tracker{cur: *NewState()}
	for i := range t.dirty {
		t.dirty[i] = map[string]struct{}{}
	}
	return t
}

// NewTrackerFrom returns a Tracker holding the objects of st (which it does not modify).
func NewTrackerFrom(st *State) *Tracker {
	t := NewTracker()
	t.cur = *st.Clone()
	t.rvShared = true // st's Revision is shared with st
	return t
}

func put[T any](t *Tracker, mp *map[string]*T, kind int, key string, obj *T) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := *mp
	if m[key] == obj { // stored values are never nil, so this also covers removing an absent key
		return
	}
	if t.shared[kind] {
		if sp := t.spare[kind]; sp.m != nil && sp.gen == t.mapGen[kind] {
			m = sp.m.(map[string]*T)
		} else {
			// maps.Clone copies the hash table as it is, several times faster than
			// re-inserting.
			m = maps.Clone(m)
		}
		t.spare[kind] = spareMap{}
		t.mapGen[kind]++
		*mp = m
		t.shared[kind] = false
	}
	if obj == nil {
		delete(m, key)
	} else {
		m[key] = obj
	}
	t.dirty[kind][key] = struct{}{}
}

// SetNamespace stores ns under its name, or removes name when ns is nil.
func (t *Tracker) SetNamespace(name string, ns *corev1.Namespace) {
	put(t, &t.cur.Namespaces, kindNamespace, name, ns)
}

// SetPod stores pod under key (namespace/name), or removes key when pod is nil.
func (t *Tracker) SetPod(key string, pod *Pod) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur.Pods.Get(key) == pod { // stored pods are never nil
		return
	}
	t.cur.Pods.Set(key, pod) // copies only the shard of key, when a snapshot shares it
	t.dirty[kindPod][key] = struct{}{}
}

// Pod returns the pod stored under key, nil if none.
func (t *Tracker) Pod(key string) *Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur.Pods.Get(key)
}

// PodKeys returns the keys of the stored pods, in no order.
func (t *Tracker) PodKeys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.AppendSeq(make([]string, 0, t.cur.Pods.Len()), t.cur.Pods.Keys())
}

// SetPolicy stores np under key (namespace/name), or removes key when np is nil.
func (t *Tracker) SetPolicy(key string, np *networkingv1.NetworkPolicy) {
	put(t, &t.cur.Policies, kindPolicy, key, np)
}

// SetNode stores node under its name, or removes name when node is nil.
func (t *Tracker) SetNode(name string, node *corev1.Node) { put(t, &t.cur.Nodes, kindNode, name, node) }

// SetClusterPolicy stores cnp under its name, or removes name when cnp is nil.
func (t *Tracker) SetClusterPolicy(name string, cnp *npav1beta1.ClusterNetworkPolicy) {
	put(t, &t.cur.ClusterPolicies, kindClusterPolicy, name, cnp)
}

// ClearClusterPolicies removes every ClusterNetworkPolicy, for a source whose CRD went away, and
// returns how many there were.
func (t *Tracker) ClearClusterPolicies() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.cur.ClusterPolicies)
	if n == 0 {
		return 0
	}
	for name := range t.cur.ClusterPolicies {
		t.dirty[kindClusterPolicy][name] = struct{}{}
	}
	// A new map rather than a cleared one: a snapshot may share the current one.
	t.cur.ClusterPolicies = map[string]*npav1beta1.ClusterNetworkPolicy{}
	t.shared[kindClusterPolicy] = false
	t.spare[kindClusterPolicy] = spareMap{}
	t.mapGen[kindClusterPolicy]++
	return n
}

// writable returns *m ready to be written: copied first when a snapshot also holds it (shared),
// made when nil. The copy on write keeps every published Revision unchanged.
func writable[V any](m *map[string]V, shared *bool) map[string]V {
	if *shared || *m == nil {
		*m = maps.Clone(*m)
		if *m == nil {
			*m = map[string]V{}
		}
		*shared = false
	}
	return *m
}

// SeenResourceVersion records that the events of resource up to resourceVersion rv have been
// delivered (see Revision.ResourceVersions); it never moves backwards, as a relist delivers
// objects with older versions again.
func (t *Tracker) SeenResourceVersion(resource string, rv uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rv <= t.cur.Revision.ResourceVersions[resource] {
		return
	}
	writable(&t.cur.Revision.ResourceVersions, &t.rvShared)[resource] = rv
	t.revisionChanged = true
}

// SetFile records that manifest file name was read with content hash sum (see
// Revision.Files), or that it is no longer read when sum is "".
func (t *Tracker) SetFile(name, sum string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.pendingFiles[name]
	if !ok {
		old, ok = t.cur.Revision.Files.Get(name)
	} else {
		ok = old != ""
	}
	if old == sum && ok == (sum != "") {
		return
	}
	if t.pendingFiles == nil {
		t.pendingFiles = map[string]string{}
	}
	t.pendingFiles[name] = sum
	t.revisionChanged = true
}

// publishFiles folds the pending file hashes into cur.Revision.Files, which is about to be
// handed out.
func (t *Tracker) publishFiles() {
	if len(t.pendingFiles) > 0 {
		t.cur.Revision.Files = t.cur.Revision.Files.With(t.pendingFiles)
		t.pendingFiles = nil
	}
}

// Counts returns how many namespaces, pods, policies and nodes are stored, without taking a
// snapshot (which would fold the pending changes into it, away from the next reader's).
func (t *Tracker) Counts() (namespaces, pods, policies, nodes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.cur.Namespaces), t.cur.Pods.Len(), len(t.cur.Policies), len(t.cur.Nodes)
}

// ClusterPolicyCount returns how many ClusterNetworkPolicies are stored (see Counts).
func (t *Tracker) ClusterPolicyCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.cur.ClusterPolicies)
}

// Snapshot returns the current objects as an immutable State. When nothing changed since the
// previous snapshot it returns that one again.
func (t *Tracker) Snapshot() *State {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := t.revisionChanged
	for _, d := range t.dirty {
		changed = changed || len(d) > 0
	}
	if t.last != nil && !changed {
		return t.last
	}
	t.publishFiles()
	st := &State{Namespaces: t.cur.Namespaces, Pods: t.cur.Pods.Clone(), Policies: t.cur.Policies, Nodes: t.cur.Nodes,
		ClusterPolicies: t.cur.ClusterPolicies, Generation: generations.Add(1), Revision: t.cur.Revision}
	t.shared = [5]bool{true, true, true, true, true}
	t.rvShared, t.revisionChanged = true, false
	if t.last != nil {
		st.Changes = &Changes{
			Since:      t.last.Generation,
			Namespaces: sortedSet(t.dirty[kindNamespace]),
			Pods:       sortedSet(t.dirty[kindPod]),
			Policies:   sortedSet(t.dirty[kindPolicy]),
			Nodes:      sortedSet(t.dirty[kindNode]),

			ClusterPolicies: sortedSet(t.dirty[kindClusterPolicy]),
		}
	}
	for _, d := range t.dirty {
		clear(d)
	}
	t.last = st
	t.prepareSpares()
	return st
}

// spareMin is the size from which a map gets a spare: copying a smaller one costs a change
// less than the spare's upkeep.
const spareMin = 256

// spareDelay is how long after a snapshot its spares are made: after the sync it is for, as a
// rule, rather than beside it.
const spareDelay = 5 * time.Millisecond

// prepareSpares has, unless it is already at it, a goroutine copy the shared maps without a
// spare, after the work the snapshot is for rather than in the next change. The copies are
// made of maps no one writes (a shared map is copied before any change), outside the lock.
// Called with t.mu held.
func (t *Tracker) prepareSpares() {
	if t.preparing {
		return
	}
	var jobs []func()
	need := func(kind, n int) bool {
		return t.shared[kind] && n >= spareMin && (t.spare[kind].m == nil || t.spare[kind].gen != t.mapGen[kind])
	}
	add := func(kind int, gen uint64, clone func() any) {
		jobs = append(jobs, func() {
			// A change that came first made its own copy: under a churn of changes, most
			// do, and a spare made anyway doubles the copying.
			wanted := func() bool { return t.mapGen[kind] == gen && t.shared[kind] }
			t.mu.Lock()
			if !wanted() {
				t.mu.Unlock()
				return
			}
			t.mu.Unlock()
			m := clone()
			t.mu.Lock()
			defer t.mu.Unlock()
			if wanted() {
				t.spare[kind] = spareMap{gen: gen, m: m}
			}
		})
	}
	if ns := t.cur.Namespaces; need(kindNamespace, len(ns)) {
		add(kindNamespace, t.mapGen[kindNamespace], func() any { return maps.Clone(ns) })
	}
	if nps := t.cur.Policies; need(kindPolicy, len(nps)) {
		add(kindPolicy, t.mapGen[kindPolicy], func() any { return maps.Clone(nps) })
	}
	if nodes := t.cur.Nodes; need(kindNode, len(nodes)) {
		add(kindNode, t.mapGen[kindNode], func() any { return maps.Clone(nodes) })
	}
	if cnps := t.cur.ClusterPolicies; need(kindClusterPolicy, len(cnps)) {
		add(kindClusterPolicy, t.mapGen[kindClusterPolicy], func() any { return maps.Clone(cnps) })
	}
	if len(jobs) == 0 {
		return
	}
	t.preparing = true
	time.AfterFunc(spareDelay, func() {
		for _, job := range jobs {
			job()
		}
		t.mu.Lock()
		t.preparing = false
		done := t.prepared
		t.prepareSpares() // for snapshots taken meanwhile
		t.mu.Unlock()
		if done != nil {
			done()
		}
	})
}

// Nodes returns the current Nodes by name and the Revision they are current at; neither is
// modified afterwards.
func (t *Tracker) Nodes() (map[string]*corev1.Node, Revision) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shared[kindNode] = true // the caller now holds cur's map too
	t.rvShared = true
	t.publishFiles()
	return t.cur.Nodes, t.cur.Revision
}

func sortedSet(m map[string]struct{}) []string {
	if len(m) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(m))
}

// NumberAfter gives st, a state built as a whole by a source that does not track single
// changes, a generation and, when prev is numbered, the Changes since prev, found by
// comparing object pointers. It must be called before st is handed out.
func NumberAfter(st, prev *State) {
	st.Generation = generations.Add(1)
	if prev == nil || prev.Generation == 0 {
		return
	}
	st.Changes = &Changes{
		Since:      prev.Generation,
		Namespaces: changedKeys(prev.Namespaces, st.Namespaces),
		Pods:       changedPodKeys(prev.Pods, st.Pods),
		Policies:   changedKeys(prev.Policies, st.Policies),
		Nodes:      changedKeys(prev.Nodes, st.Nodes),

		ClusterPolicies: changedKeys(prev.ClusterPolicies, st.ClusterPolicies),
	}
}

func changedKeys[T any](old, new map[string]*T) []string {
	var keys []string
	for k, v := range new {
		if old[k] != v {
			keys = append(keys, k)
		}
	}
	for k := range old {
		if _, ok := new[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
