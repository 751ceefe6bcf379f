package cluster

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// TestTrackerChanges checks every snapshot's Changes against a pointer comparison with the
// snapshot before it: a key left out would make the compiler miss a change.
func TestTrackerChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tr := NewTracker()
	prev := tr.Snapshot()
	if prev.Generation == 0 || prev.Changes != nil {
		t.Fatalf("first snapshot: generation %d, changes %v; want numbered, no changes", prev.Generation, prev.Changes)
	}
	for step := range 500 {
		for range 1 + r.IntN(4) {
			name := fmt.Sprintf("o-%d", r.IntN(8))
			del := r.IntN(3) == 0
			switch r.IntN(4) {
			case 0:
				var ns *corev1.Namespace
				if !del {
					ns = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
				}
				tr.SetNamespace(name, ns)
			case 1:
				var p *Pod
				if !del {
					p = &Pod{Namespace: "a", Name: name}
				}
				tr.SetPod(Key("a", name), p)
			case 2:
				var np *networkingv1.NetworkPolicy
				if !del {
					np = &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name}}
				}
				tr.SetPolicy(Key("a", name), np)
			case 3:
				var n *corev1.Node
				if !del {
					n = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
				}
				tr.SetNode(name, n)
			}
		}
		if got, _ := tr.Nodes(); !reflect.DeepEqual(got, tr.cur.Nodes) {
			t.Fatalf("step %d: Nodes() = %v, want %v", step, got, tr.cur.Nodes)
		}
		st := tr.Snapshot()
		if st == prev {
			if !st.Pods.Equal(tr.cur.Pods) || !reflect.DeepEqual(st.Policies, tr.cur.Policies) ||
				!reflect.DeepEqual(st.Namespaces, tr.cur.Namespaces) || !reflect.DeepEqual(st.Nodes, tr.cur.Nodes) {
				t.Fatalf("step %d: unchanged snapshot returned although objects changed", step)
			}
			continue
		}
		if st.Changes == nil || st.Changes.Since != prev.Generation || st.Generation <= prev.Generation {
			t.Fatalf("step %d: snapshot %d has changes %+v, want since %d", step, st.Generation, st.Changes, prev.Generation)
		}
		want := &State{Namespaces: st.Namespaces, Pods: st.Pods, Policies: st.Policies, Nodes: st.Nodes}
		NumberAfter(want, prev)
		w, g := *want.Changes, *st.Changes
		w.Since, g.Since = 0, 0
		// A key set and reset to its old object between snapshots may be listed; a changed
		// key must be.
		for _, c := range []struct {
			kind      string
			got, want []string
		}{{"namespaces", g.Namespaces, w.Namespaces}, {"pods", g.Pods, w.Pods}, {"policies", g.Policies, w.Policies}, {"nodes", g.Nodes, w.Nodes}} {
			listed := map[string]bool{}
			for _, k := range c.got {
				listed[k] = true
			}
			for _, k := range c.want {
				if !listed[k] {
					t.Fatalf("step %d: %s key %s changed but is not listed in %v", step, c.kind, k, c.got)
				}
			}
		}
		// Later changes must not leak into a snapshot already handed out.
		frozen := st.Pods.Len() + len(st.Nodes)
		tr.SetPod(Key("a", "late"), &Pod{})
		tr.SetNode("late", &corev1.Node{})
		if st.Pods.Len()+len(st.Nodes) != frozen {
			t.Fatalf("step %d: a snapshot changed after it was handed out", step)
		}
		tr.SetPod(Key("a", "late"), nil)
		tr.SetNode("late", nil)
		prev = st
	}
}

func TestTrackerFiles(t *testing.T) {
	tr := NewTracker()
	tr.SetFile("a.yaml", "1")
	tr.SetFile("b.yaml", "2")
	s1 := tr.Snapshot()
	if want := map[string]string{"a.yaml": "1", "b.yaml": "2"}; !maps.Equal(s1.Revision.Files.Map(), want) {
		t.Fatalf("files %v, want %v", s1.Revision.Files.Map(), want)
	}
	tr.SetFile("a.yaml", "1")
	tr.SetFile("c.yaml", "")
	if s := tr.Snapshot(); s != s1 {
		t.Error("a snapshot for files that did not change")
	}
	tr.SetFile("a.yaml", "3")
	tr.SetFile("b.yaml", "")
	s2 := tr.Snapshot()
	if s2 == s1 || s2.Changes == nil || len(s2.Changes.Pods)+len(s2.Changes.Policies)+len(s2.Changes.Namespaces)+len(s2.Changes.Nodes) != 0 {
		t.Errorf("a new snapshot listing no object: %+v", s2.Changes)
	}
	if want := map[string]string{"a.yaml": "3"}; !maps.Equal(s2.Revision.Files.Map(), want) {
		t.Errorf("files %v, want %v", s2.Revision.Files.Map(), want)
	}
	if want := map[string]string{"a.yaml": "1", "b.yaml": "2"}; !maps.Equal(s1.Revision.Files.Map(), want) {
		t.Errorf("published files changed to %v", s1.Revision.Files.Map())
	}
	_, rev := tr.Nodes()
	tr.SetFile("d.yaml", "4")
	if _, ok := rev.Files.Get("d.yaml"); ok {
		t.Error("the Revision handed out with Nodes changed")
	}
}

// TestTrackerClearClusterPolicies: clearing lists every removed key and leaves published
// snapshots as they were.
func TestTrackerClearClusterPolicies(t *testing.T) {
	tr := NewTracker()
	if n := tr.ClearClusterPolicies(); n != 0 {
		t.Errorf("cleared %d from an empty tracker", n)
	}
	for _, name := range []string{"a", "b"} {
		tr.SetClusterPolicy(name, &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	tr.SetPolicy("ns/p", &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}})
	before := tr.Snapshot()
	if n := tr.ClearClusterPolicies(); n != 2 {
		t.Errorf("cleared %d, want 2", n)
	}
	after := tr.Snapshot()
	if len(after.ClusterPolicies) != 0 || len(before.ClusterPolicies) != 2 || after.Policies["ns/p"] == nil {
		t.Errorf("after: %v, before: %v", after.ClusterPolicies, before.ClusterPolicies)
	}
	if ch := after.Changes; ch == nil || !reflect.DeepEqual(ch.ClusterPolicies, []string{"a", "b"}) || len(ch.Policies) != 0 {
		t.Errorf("changes %+v", ch)
	}
	tr.SetClusterPolicy("c", &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "c"}})
	if st := tr.Snapshot(); len(st.ClusterPolicies) != 1 || len(after.ClusterPolicies) != 0 {
		t.Errorf("a policy added after clearing: %v, the snapshot before it: %v", st.ClusterPolicies, after.ClusterPolicies)
	}
}

// TestTrackerSpares checks the copies a Tracker makes of shared maps ahead of their next
// change: a change takes the copy, which holds every object of the map it was made of, no
// snapshot ever changes after it is handed out, and a copy of a map replaced since is not
// used.
func TestTrackerSpares(t *testing.T) {
	tr := NewTracker()
	prepared := make(chan struct{}, 100)
	tr.prepared = func() { prepared <- struct{}{} }
	wait := func() {
		t.Helper()
		for {
			tr.mu.Lock()
			busy := tr.preparing
			tr.mu.Unlock()
			if !busy {
				return
			}
			<-prepared
		}
	}
	// Policies: pods are held in a PodMap, whose snapshots share shards instead.
	pod := func(name string) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name}}
	}
	for i := range spareMin + 10 {
		tr.SetPolicy(Key("a", fmt.Sprint(i)), pod(fmt.Sprint(i)))
	}
	var snaps []*State
	var frozen []map[string]*networkingv1.NetworkPolicy
	check := func(step int) {
		t.Helper()
		for i, st := range snaps {
			if !maps.Equal(st.Policies, frozen[i]) {
				t.Fatalf("step %d: snapshot %d changed after it was handed out", step, i)
			}
		}
	}
	for step := range 50 {
		st := tr.Snapshot()
		snaps, frozen = append(snaps, st), append(frozen, maps.Clone(st.Policies))
		if step%3 != 2 {
			wait() // the change below takes the spare; every third makes its own copy
			tr.mu.Lock()
			ready := tr.spare[kindPolicy].m != nil && tr.spare[kindPolicy].gen == tr.mapGen[kindPolicy]
			tr.mu.Unlock()
			if !ready {
				t.Fatalf("step %d: no spare of the policies map after the snapshot", step)
			}
		}
		name := fmt.Sprint(step % 7)
		if step%2 == 0 {
			tr.SetPolicy(Key("a", name), pod(name+"-new"))
		} else {
			tr.SetPolicy(Key("a", name), nil)
		}
		want := maps.Clone(st.Policies)
		if step%2 == 0 {
			want[Key("a", name)] = tr.cur.Policies[Key("a", name)]
		} else {
			delete(want, Key("a", name))
		}
		if !maps.Equal(tr.cur.Policies, want) {
			t.Fatalf("step %d: the policies after the change differ from the snapshot's with the change", step)
		}
		check(step)
	}
	wait()
	// A spare of a map that was replaced since is left unused.
	st := tr.Snapshot()
	wait()
	tr.SetPolicy(Key("a", "x"), pod("x")) // takes the spare
	stale := tr.spare[kindPolicy]
	tr.mu.Lock()
	tr.spare[kindPolicy] = spareMap{gen: tr.mapGen[kindPolicy] - 1, m: map[string]*networkingv1.NetworkPolicy{}}
	tr.shared[kindPolicy] = true
	tr.mu.Unlock()
	tr.SetPolicy(Key("a", "y"), pod("y"))
	if len(tr.cur.Policies) != len(st.Policies)+2 || stale.m != nil {
		t.Fatalf("a stale spare was used: %d policies, want %d", len(tr.cur.Policies), len(st.Policies)+2)
	}
	wait()
}
