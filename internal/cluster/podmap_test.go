package cluster

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPodMap drives a PodMap and its clones with random sets and removals against plain Go maps:
// every copy keeps what it held when it was made, whatever the others do afterwards, and the
// changed keys between two copies are those whose pods differ.
func TestPodMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var nilMap *PodMap
	if nilMap.Get("a/b") != nil || nilMap.Len() != 0 || len(nilMap.Map()) != 0 || nilMap.Clone().Len() != 0 {
		t.Fatal("the nil PodMap is not empty")
	}
	cur, want := &PodMap{}, map[string]*Pod{}
	type frozen struct {
		m    *PodMap
		want map[string]*Pod
	}
	var copies []frozen
	for step := range 3000 {
		key := Key("ns", fmt.Sprint(r.IntN(2000)))
		if r.IntN(3) == 0 {
			cur.Set(key, nil)
			delete(want, key)
		} else {
			p := &Pod{Namespace: "ns", Name: key}
			cur.Set(key, p)
			want[key] = p
		}
		if cur.Len() != len(want) {
			t.Fatalf("step %d: Len %d, want %d", step, cur.Len(), len(want))
		}
		if step%97 == 0 {
			c := cur.Clone()
			if len(copies) > 0 {
				prev := copies[len(copies)-1]
				var changed []string
				for k, p := range want {
					if prev.want[k] != p {
						changed = append(changed, k)
					}
				}
				for k := range prev.want {
					if _, ok := want[k]; !ok {
						changed = append(changed, k)
					}
				}
				slices.Sort(changed)
				if got := changedPodKeys(prev.m, c); !slices.Equal(got, changed) {
					t.Fatalf("step %d: changed keys %v, want %v", step, got, changed)
				}
			}
			copies = append(copies, frozen{c, maps.Clone(want)})
		}
	}
	for i, c := range copies {
		if !maps.Equal(c.m.Map(), c.want) || c.m.Len() != len(c.want) {
			t.Fatalf("copy %d changed after it was made", i)
		}
		for k, p := range c.want {
			if c.m.Get(k) != p {
				t.Fatalf("copy %d: Get(%s) is not its pod", i, k)
			}
		}
	}
	if !cur.Equal(NewPodMap(want)) || cur.Equal(copies[0].m) {
		t.Error("Equal")
	}
	if got := slices.Sorted(cur.Keys()); !slices.Equal(got, slices.Sorted(maps.Keys(want))) {
		t.Error("Keys")
	}
}

// TestPodMapSharesShards checks that a change after a Clone copies one shard, not the map.
func TestPodMapSharesShards(t *testing.T) {
	m := &PodMap{}
	for i := range 10000 {
		k := Key("ns", fmt.Sprint(i))
		m.Set(k, &Pod{Name: k})
	}
	snap := m.Clone()
	k := Key("ns", "new")
	m.Set(k, &Pod{Name: k})
	same := 0
	for i := range podShards {
		if m.shards[i] == snap.shards[i] {
			same++
		}
	}
	if same != podShards-1 || snap.Get(k) != nil || m.Get(k) == nil {
		t.Errorf("%d of %d shards shared after one change (want all but one); the clone holds the change: %v", same, podShards, snap.Get(k) != nil)
	}
	// Setting what is already there copies nothing.
	snap2 := m.Clone()
	m.Set(k, m.Get(k))
	m.Set(Key("ns", "absent"), nil)
	if m.shards != snap2.shards {
		t.Error("a Set that changes nothing copied a shard")
	}
}
