// Package sortedset holds large sorted sets of values that are published often and change a
// little between publications, such as the peer set of a policy that selects every pod of a
// 150,000-pod cluster. A Builder keeps its values in chunks of a few hundred; a Set is an
// immutable snapshot that shares the Builder's chunks. After a snapshot, the Builder copies a
// chunk before its first change to it, so publishing a set after a change costs the chunks it
// touched and the index of chunks, not a copy of every value.
package sortedset

import (
	"iter"
	"slices"
	"sort"
)

// Ordered is a value with a total order, as netip.Addr and netip.AddrPort have.
type Ordered[T any] interface{ Compare(T) int }

// chunkMax is the most values a chunk holds: a change copies at most this many, and an index
// of chunks for 150,000 values is a few hundred entries.
const chunkMax = 512

// Set is an immutable sorted set of distinct values. The zero Set is empty.
type Set[T Ordered[T]] struct {
	chunks [][]T // each sorted and non-empty; every value of one is below every value of the next
	n      int
}

// Of returns the Set of vals, in any order and with repeats. It takes vals over: the caller
// must not use it afterwards.
func Of[T Ordered[T]](vals ...T) Set[T] {
	var b Builder[T]
	b.Reset(vals)
	return b.Set()
}

// Len is the number of values.
func (s Set[T]) Len() int { return s.n }

// All yields the values in ascending order.
func (s Set[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, c := range s.chunks {
			for _, v := range c {
				if !yield(v) {
					return
				}
			}
		}
	}
}

// Slice returns a new slice of the values in ascending order.
func (s Set[T]) Slice() []T {
	out := make([]T, 0, s.n)
	for _, c := range s.chunks {
		out = append(out, c...)
	}
	return out
}

// Contains reports whether s holds v.
func (s Set[T]) Contains(v T) bool {
	i := chunkOf(s.chunks, v)
	if i == len(s.chunks) {
		return false
	}
	_, found := slices.BinarySearchFunc(s.chunks[i], v, compare[T])
	return found
}

// Equal reports whether s and o hold the same values.
func (s Set[T]) Equal(o Set[T]) bool {
	if s.n != o.n {
		return false
	}
	var oc, oi int // o's chunk and index in it
	for _, c := range s.chunks {
		for _, v := range c {
			if v.Compare(o.chunks[oc][oi]) != 0 {
				return false
			}
			if oi++; oi == len(o.chunks[oc]) {
				oc, oi = oc+1, 0
			}
		}
	}
	return true
}

func compare[T Ordered[T]](a, b T) int { return a.Compare(b) }

// chunkOf returns the first chunk whose last value is v or above, len(chunks) if none is.
func chunkOf[T Ordered[T]](chunks [][]T, v T) int {
	return sort.Search(len(chunks), func(i int) bool {
		c := chunks[i]
		return c[len(c)-1].Compare(v) >= 0
	})
}

// Builder is a sorted set of distinct values that changes in place and hands out Sets. The
// zero Builder is empty. A Builder is not safe for concurrent use; the Sets it returns are.
type Builder[T Ordered[T]] struct {
	chunks [][]T
	// owned[i] says chunk i is the Builder's alone: no Set shares its array, so it may be
	// written in place.
	owned []bool
	// indexShared says a Set shares the chunks slice itself, which is copied before it changes.
	indexShared bool
	n           int
}

// Len is the number of values.
func (b *Builder[T]) Len() int { return b.n }

// Contains reports whether b holds v.
func (b *Builder[T]) Contains(v T) bool { return Set[T]{chunks: b.chunks}.Contains(v) }

// Set returns the current values as a Set, which later changes to b leave as it is.
func (b *Builder[T]) Set() Set[T] {
	if b.n == 0 {
		return Set[T]{}
	}
	b.indexShared = true
	clear(b.owned)
	return Set[T]{chunks: b.chunks, n: b.n}
}

// Reset makes vals, in any order and with repeats, the values of b. It takes vals over:
// the caller must not use it afterwards.
func (b *Builder[T]) Reset(vals []T) {
	slices.SortFunc(vals, compare[T])
	vals = slices.CompactFunc(vals, func(a, b T) bool { return a.Compare(b) == 0 })
	// Filled to three quarters, so that inserts split few chunks.
	per := chunkMax * 3 / 4
	chunks := make([][]T, 0, (len(vals)+per-1)/per)
	for start := 0; start < len(vals); start += per {
		end := min(start+per, len(vals))
		// Capped at its end, so growing one chunk never writes into the next.
		chunks = append(chunks, vals[start:end:end])
	}
	b.chunks, b.n, b.indexShared = chunks, len(vals), false
	b.owned = make([]bool, len(chunks))
	for i := range b.owned {
		b.owned[i] = true
	}
}

// Insert adds v and reports whether it was not there yet.
func (b *Builder[T]) Insert(v T) bool {
	if len(b.chunks) == 0 {
		b.writeIndex()
		b.chunks = append(b.chunks, []T{v})
		b.owned = append(b.owned, true)
		b.n = 1
		return true
	}
	i := min(chunkOf(b.chunks, v), len(b.chunks)-1)
	j, found := slices.BinarySearchFunc(b.chunks[i], v, compare[T])
	if found {
		return false
	}
	c := slices.Insert(b.writable(i), j, v)
	b.n++
	if len(c) <= chunkMax {
		b.chunks[i] = c
		return true
	}
	half := len(c) / 2
	b.chunks[i] = c[:half:half]
	b.chunks = slices.Insert(b.chunks, i+1, c[half:])
	b.owned = slices.Insert(b.owned, i+1, true)
	return true
}

// Delete removes v and reports whether it was there.
func (b *Builder[T]) Delete(v T) bool {
	i := chunkOf(b.chunks, v)
	if i == len(b.chunks) {
		return false
	}
	j, found := slices.BinarySearchFunc(b.chunks[i], v, compare[T])
	if !found {
		return false
	}
	c := slices.Delete(b.writable(i), j, j+1)
	b.n--
	switch {
	case len(c) == 0:
		b.chunks = slices.Delete(b.chunks, i, i+1)
		b.owned = slices.Delete(b.owned, i, i+1)
	default:
		b.chunks[i] = c
		if len(c) < chunkMax/4 {
			b.joinNeighbour(i)
		}
	}
	return true
}

// joinNeighbour joins chunk i, which shrank below a quarter of chunkMax, to the next chunk or
// else the previous one, when the two fit in one: churn then leaves few small chunks, though
// one whose neighbours are both nearly full stays on its own.
func (b *Builder[T]) joinNeighbour(i int) {
	j := -1 // the first of the two to join
	switch fits := func(k int) bool { return len(b.chunks[k])+len(b.chunks[k+1]) <= chunkMax }; {
	case i+1 < len(b.chunks) && fits(i):
		j = i
	case i > 0 && fits(i-1):
		j = i - 1
	default:
		return
	}
	b.writeIndex()
	merged := make([]T, 0, len(b.chunks[j])+len(b.chunks[j+1])+chunkMax/8)
	merged = append(append(merged, b.chunks[j]...), b.chunks[j+1]...)
	b.chunks[j], b.owned[j] = merged, true
	b.chunks = slices.Delete(b.chunks, j+1, j+2)
	b.owned = slices.Delete(b.owned, j+1, j+2)
}

// writeIndex makes the chunks slice b's own to change.
func (b *Builder[T]) writeIndex() {
	if b.indexShared {
		b.chunks = slices.Clone(b.chunks)
		b.indexShared = false
	}
}

// writable returns chunk i, copied first if a Set shares it.
func (b *Builder[T]) writable(i int) []T {
	b.writeIndex()
	if !b.owned[i] {
		c := b.chunks[i]
		b.chunks[i] = append(make([]T, 0, len(c)+chunkMax/8), c...)
		b.owned[i] = true
	}
	return b.chunks[i]
}
