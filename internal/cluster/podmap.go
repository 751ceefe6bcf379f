package cluster

import (
	"hash/maphash"
	"iter"
	"maps"
	"slices"
)

// podShards is how many parts a PodMap is cut into: at 150,000 pods a change copies a part of
// about 600 of them.
const podShards = 256

// PodMap is a map of pods by key (namespace/name) whose copies share what they have in common.
// A snapshot of the tracker's pods is taken per sync, tens of times a second under a churn of
// pod changes; a Go map copied whole at 150,000 pods costs milliseconds and megabytes each time.
// A PodMap is cut into shards by a hash of the key, shared between copies and copied only when a
// copy writes to one it does not own.
//
// A PodMap handed out in a State is never written again. Set is for one being built: it is not
// safe for concurrent use. The nil *PodMap is empty.
type PodMap struct {
	shards [podShards]*podShard
	n      int
	// owned marks the shards no other PodMap shares, which Set may write in place.
	owned [podShards / 64]uint64
}

type podShard struct{ m map[string]*Pod }

var podSeed = maphash.MakeSeed()

func shardOf(key string) int { return int(maphash.String(podSeed, key) % podShards) }

// NewPodMap returns a PodMap holding the pods of m.
func NewPodMap(m map[string]*Pod) *PodMap {
	out := &PodMap{}
	for k, p := range m {
		out.Set(k, p)
	}
	return out
}

// Get returns the pod of key, nil when there is none.
func (m *PodMap) Get(key string) *Pod {
	if m == nil {
		return nil
	}
	if s := m.shards[shardOf(key)]; s != nil {
		return s.m[key]
	}
	return nil
}

// Len returns how many pods m holds.
func (m *PodMap) Len() int {
	if m == nil {
		return 0
	}
	return m.n
}

// All yields every key and pod of m, in no particular order.
func (m *PodMap) All() iter.Seq2[string, *Pod] {
	return func(yield func(string, *Pod) bool) {
		if m == nil {
			return
		}
		for _, s := range m.shards {
			if s == nil {
				continue
			}
			for k, p := range s.m {
				if !yield(k, p) {
					return
				}
			}
		}
	}
}

// Keys yields every key of m, in no particular order.
func (m *PodMap) Keys() iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range m.All() {
			if !yield(k) {
				return
			}
		}
	}
}

// Set stores pod under key, or removes key when pod is nil. It copies the shard first when
// another PodMap shares it.
func (m *PodMap) Set(key string, pod *Pod) {
	i := shardOf(key)
	s := m.shards[i]
	if s == nil {
		if pod == nil {
			return
		}
		s = &podShard{m: map[string]*Pod{}}
		m.shards[i] = s
		m.owned[i/64] |= 1 << (i % 64)
	} else if m.owned[i/64]&(1<<(i%64)) == 0 {
		if old, ok := s.m[key]; ok == (pod != nil) && old == pod {
			return
		}
		s = &podShard{m: maps.Clone(s.m)}
		m.shards[i] = s
		m.owned[i/64] |= 1 << (i % 64)
	}
	_, had := s.m[key]
	if pod == nil {
		delete(s.m, key)
	} else {
		s.m[key] = pod
	}
	switch {
	case had && pod == nil:
		m.n--
	case !had && pod != nil:
		m.n++
	}
}

// Clone returns a PodMap holding the same pods as m, sharing every shard with it (the next Set of
// either copies the shard it writes). A map still being built owns its shards, and Clone gives
// them up, which writes m: such a map must not be cloned by two goroutines at once. A map handed
// out in a State owns none, and Clone only reads it.
func (m *PodMap) Clone() *PodMap {
	if m == nil {
		return &PodMap{}
	}
	c := &PodMap{shards: m.shards, n: m.n}
	if m.owned != [podShards / 64]uint64{} {
		m.owned = [podShards / 64]uint64{}
	}
	return c
}

// Equal reports whether m and o hold the same pods (the same pointers) under the same keys.
func (m *PodMap) Equal(o *PodMap) bool {
	if m.Len() != o.Len() {
		return false
	}
	for k, p := range m.All() {
		if o.Get(k) != p {
			return false
		}
	}
	return true
}

// Map returns the pods of m in a Go map, for tests and tools.
func (m *PodMap) Map() map[string]*Pod {
	out := make(map[string]*Pod, m.Len())
	for k, p := range m.All() {
		out[k] = p
	}
	return out
}

// changedPodKeys lists the keys whose pods differ between old and new, looking only into the
// shards they do not share.
func changedPodKeys(old, new *PodMap) []string {
	var keys []string
	for i := range podShards {
		var o, n *podShard
		if old != nil {
			o = old.shards[i]
		}
		if new != nil {
			n = new.shards[i]
		}
		if o == n {
			continue
		}
		var om, nm map[string]*Pod
		if o != nil {
			om = o.m
		}
		if n != nil {
			nm = n.m
		}
		keys = append(keys, changedKeys(om, nm)...)
	}
	slices.Sort(keys)
	return keys
}
