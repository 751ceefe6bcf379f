package policy

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMultiset adds and removes values at random, some held by two pods at once, against a
// count of each value, and publishes versions on the way: the content is the values held, each
// delta is the difference between two versions, and no published version changes afterwards.
func TestMultiset(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var m members[int]
	m = newMembers(func(a, b int) int { return a - b })
	count := map[int]int{}
	type version struct{ values, copy []int }
	var published []version
	var last []int
	for step := range 5000 {
		key := string(rune('a' + r.IntN(40)))
		var vals []int
		if r.IntN(4) > 0 {
			for range 1 + r.IntN(3) {
				vals = append(vals, r.IntN(60)) // overlaps between pods are common
			}
			slices.Sort(vals)
			vals = slices.Compact(vals)
		}
		for _, v := range m.byPod[key] {
			count[v]--
		}
		for _, v := range vals {
			count[v]++
		}
		m.set(key, vals)
		if step%37 == 0 && step > 0 {
			var want []int
			for v, n := range count {
				if n > 0 {
					want = append(want, v)
				}
			}
			slices.Sort(want)
			values, added, removed := m.version()
			if !slices.Equal(values, want) {
				t.Fatalf("step %d: content %v, want %v", step, values, want)
			}
			for _, v := range added {
				if slices.Contains(last, v) || !slices.Contains(want, v) {
					t.Fatalf("step %d: %d added but was there or is not", step, v)
				}
			}
			for _, v := range removed {
				if !slices.Contains(last, v) || slices.Contains(want, v) {
					t.Fatalf("step %d: %d removed but was not there or still is", step, v)
				}
			}
			if len(want)-len(last) != len(added)-len(removed) {
				t.Fatalf("step %d: delta +%v -%v does not lead from %v to %v", step, added, removed, last, want)
			}
			published = append(published, version{values, slices.Clone(values)})
			last = want
		}
	}
	for i, v := range published {
		if !slices.Equal(v.values, v.copy) {
			t.Fatalf("version %d changed after it was published", i)
		}
	}
	// build counts the values held twice, so that one removal keeps them.
	var b members[int]
	b = newMembers(func(a, b int) int { return a - b })
	b.fill(map[string][]int{"x": {1, 2}, "y": {2, 3}})
	b.set("y", nil)
	if values, _, _ := b.version(); !slices.Equal(values, []int{1, 2}) || !maps.Equal(b.content.extra, map[int]int{}) {
		t.Errorf("after fill and one removal: %v, extra %v", values, b.content.extra)
	}
}
