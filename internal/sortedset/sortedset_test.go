package sortedset

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func addr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// TestBuilderAgainstMap changes a Builder at random, taking Sets now and then, and checks
// every Set against the values the reference held when it was taken, again at the end: a
// later change must never show through an earlier Set.
func TestBuilderAgainstMap(t *testing.T) {
	for _, size := range []int{0, 1, 300, 5000} {
		rng := rand.New(rand.NewPCG(uint64(size), 7))
		universe := 2*size + 10
		ref := map[netip.Addr]bool{}
		var initial []netip.Addr
		for range size {
			a := addr(rng.IntN(universe))
			initial = append(initial, a, a) // repeats are allowed
			ref[a] = true
		}
		var b Builder[netip.Addr]
		b.Reset(initial)
		type taken struct {
			set  Set[netip.Addr]
			want []netip.Addr
		}
		var sets []taken
		check := func(step string, s Set[netip.Addr], want []netip.Addr) {
			t.Helper()
			if got := s.Slice(); !slices.Equal(got, want) || s.Len() != len(want) {
				t.Fatalf("size %d, %s: set holds %d values (Len %d), want %d", size, step, len(got), s.Len(), len(want))
			}
			if !s.Equal(Of(want...)) {
				t.Fatalf("size %d, %s: Equal false against the same values", size, step)
			}
		}
		sorted := func() []netip.Addr {
			out := make([]netip.Addr, 0, len(ref))
			for a := range ref {
				out = append(out, a)
			}
			slices.SortFunc(out, netip.Addr.Compare)
			return out
		}
		for step := range 20000 {
			a := addr(rng.IntN(universe))
			switch rng.IntN(3) {
			case 0:
				if got := b.Insert(a); got == ref[a] {
					t.Fatalf("size %d, step %d: Insert(%v) = %v with the value present: %v", size, step, a, got, ref[a])
				}
				ref[a] = true
			case 1:
				if got := b.Delete(a); got != ref[a] {
					t.Fatalf("size %d, step %d: Delete(%v) = %v, present: %v", size, step, a, got, ref[a])
				}
				delete(ref, a)
			case 2:
				if b.Contains(a) != ref[a] {
					t.Fatalf("size %d, step %d: Contains(%v) wrong", size, step, a)
				}
			}
			if b.Len() != len(ref) {
				t.Fatalf("size %d, step %d: Len %d, want %d", size, step, b.Len(), len(ref))
			}
			if rng.IntN(500) == 0 {
				s := b.Set()
				want := sorted()
				check("just taken", s, want)
				sets = append(sets, taken{s, want})
			}
		}
		for i, tk := range sets {
			check("at the end, set "+string(rune('a'+i%26)), tk.set, tk.want)
			for _, v := range tk.want {
				if !tk.set.Contains(v) {
					t.Fatalf("size %d: an earlier set lost %v", size, v)
				}
			}
		}
		for _, c := range b.chunks {
			if len(c) == 0 || len(c) > chunkMax {
				t.Fatalf("size %d: a chunk of %d values", size, len(c))
			}
		}
	}
}

// TestSetSharesChunks: a Set taken after one change shares every chunk but the changed one.
func TestSetSharesChunks(t *testing.T) {
	b := evenAddrs(100000)
	before := b.Set()
	b.Insert(addr(101))
	after := b.Set()
	if len(after.chunks) != len(before.chunks) {
		t.Fatalf("%d chunks after one insert, %d before", len(after.chunks), len(before.chunks))
	}
	differ := 0
	for i := range after.chunks {
		if &after.chunks[i][0] != &before.chunks[i][0] {
			differ++
		}
	}
	if differ != 1 {
		t.Fatalf("%d chunks copied for one insert, want 1", differ)
	}
	if before.Contains(addr(101)) || !after.Contains(addr(101)) || after.Len() != before.Len()+1 {
		t.Fatal("the insert shows in the wrong set")
	}
}

// TestSmallChunksJoin: emptying every other chunk down to one value leaves no chunk of one.
func TestSmallChunksJoin(t *testing.T) {
	b := evenAddrs(76800)
	before := len(b.chunks)
	var doomed []netip.Addr
	for i, c := range b.chunks {
		if i%2 == 0 {
			doomed = append(doomed, c[1:]...)
		}
	}
	for _, a := range doomed {
		b.Delete(a)
	}
	for i, c := range b.chunks {
		if len(c) < chunkMax/4 {
			t.Fatalf("chunk %d of %d holds %d values, after %d chunks were emptied to one each", i, len(b.chunks), len(c), before/2)
		}
	}
	if b.Len() != 76800-len(doomed) {
		t.Fatalf("Len %d, want %d", b.Len(), 76800-len(doomed))
	}
}

func BenchmarkInsertDeletePublish(b *testing.B) {
	s := evenAddrs(150000)
	rng := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		// A sync's worth of changes, then a publish.
		for range 14 {
			a := addr(rng.IntN(300000))
			if !s.Insert(a) {
				s.Delete(a)
			}
		}
		_ = s.Set()
	}
}

// evenAddrs returns a Builder of the first n addresses of even index.
func evenAddrs(n int) *Builder[netip.Addr] {
	vals := make([]netip.Addr, 0, n)
	for i := range n {
		vals = append(vals, addr(2*i))
	}
	var b Builder[netip.Addr]
	b.Reset(vals)
	return &b
}
