package policy

import (
	"cmp"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/netwarden/netwarden/internal/sortedset"
)

// num is a set value for tests.
type num int

func (a num) Compare(b num) int { return cmp.Compare(a, b) }

// TestMembers changes pods' contributions at random, some values held by two pods at once,
// against a count of each value, and publishes versions on the way: the content is the values
// held, each delta is the difference between two versions, and no published version changes
// afterwards. Now and then the set is recomputed from scratch, which must publish as a delta
// too. Pod contributions are given as apply gets them: the previous and the new version.
func TestMembers(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m := newMultiset[num]()
	count := map[num]int{}
	contrib := map[string][]num{} // the test's own record, which the set no longer keeps
	byInfo := map[*podInfo][]num{}
	infos := map[string]*podInfo{}
	valuesOf := func(pi *podInfo) []num { return byInfo[pi] }
	type version struct {
		values sortedset.Set[num]
		copy   []num
	}
	var published []version
	var last []num
	for step := range 8000 {
		key := string(rune('a' + r.IntN(400)))
		var vals []num
		if r.IntN(4) > 0 {
			for range 1 + r.IntN(3) {
				vals = append(vals, num(r.IntN(600))) // overlaps between pods are common
			}
			slices.Sort(vals)
			vals = slices.Compact(vals)
		}
		for _, v := range contrib[key] {
			count[v]--
		}
		for _, v := range vals {
			count[v]++
		}
		contrib[key] = vals
		ch := podChange{key: key, old: infos[key]}
		if vals != nil {
			ch.new = &podInfo{key: key}
			byInfo[ch.new] = vals
		}
		infos[key] = ch.new
		if ch.old != nil || ch.new != nil {
			m.apply([]podChange{ch}, valuesOf)
		}
		if step%997 == 500 {
			// As a namespace's labels change: pods' values change with no change of the pods,
			// and the set is computed again from scratch.
			for k, pi := range infos {
				if pi == nil || r.IntN(3) > 0 {
					continue
				}
				var vals []num
				if r.IntN(2) == 0 {
					vals = []num{num(r.IntN(600))}
				}
				for _, v := range contrib[k] {
					count[v]--
				}
				for _, v := range vals {
					count[v]++
				}
				contrib[k], byInfo[pi] = vals, vals
			}
			var all []num
			for _, vs := range contrib {
				all = append(all, vs...)
			}
			m.replaceWith(all)
		}
		if step%37 == 0 && step > 0 {
			var want []num
			for v, n := range count {
				if n > 0 {
					want = append(want, v)
				}
			}
			slices.Sort(want)
			values, added, removed := m.version()
			if got := values.Slice(); !slices.Equal(got, want) {
				t.Fatalf("step %d: content %v, want %v", step, got, want)
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
			published = append(published, version{values, slices.Clone(want)})
			last = want
		}
	}
	for i, v := range published {
		if !slices.Equal(v.values.Slice(), v.copy) {
			t.Fatalf("version %d changed after it was published", i)
		}
	}
	// build counts the values held twice, so that one removal keeps them.
	b := newMultiset[num]()
	x, y := &podInfo{key: "x"}, &podInfo{key: "y"}
	byInfo[x], byInfo[y] = []num{1, 2}, []num{2, 3}
	b.build([]num{1, 2, 2, 3})
	b.apply([]podChange{{key: "y", old: y}}, valuesOf)
	if values, _, _ := b.version(); !slices.Equal(values.Slice(), []num{1, 2}) || !maps.Equal(b.extra, map[num]int{}) {
		t.Errorf("after build and one removal: %v, extra %v", values.Slice(), b.extra)
	}
}
