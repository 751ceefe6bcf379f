package setdelta

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/sortedset"
)

type testSet struct{ Content[bool] }

func newTestSet(_ bool, c Content[bool]) *testSet { return &testSet{c} }

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// TestPairDelta holds the three ways Pair renders a value (reused, as a difference, in full)
// against what Changes then sends.
func TestPairDelta(t *testing.T) {
	v1 := &policy.AddrSet{Addrs: sortedset.Of(addrs("10.0.0.1", "10.0.0.2", "fd00::1")...)}
	v2 := &policy.AddrSet{Addrs: sortedset.Of(addrs("10.0.0.2", "10.0.0.3", "fd00::1")...), Prev: v1,
		Added: addrs("10.0.0.3"), Removed: addrs("10.0.0.1")}
	prev, cur := map[*policy.AddrSet][2]*testSet{}, map[*policy.AddrSet][2]*testSet{}
	p1 := Pair(prev, cur, AddrSet(v1), netip.Addr.String, true, newTestSet)
	if again := Pair(cur, map[*policy.AddrSet][2]*testSet{}, AddrSet(v1), netip.Addr.String, true, newTestSet); again != p1 {
		t.Fatal("a value rendered last time was rendered again")
	}
	p2 := Pair(cur, map[*policy.AddrSet][2]*testSet{}, AddrSet(v2), netip.Addr.String, true, newTestSet)
	if p2[0].elems != nil || p2[0].Count() != 2 || p2[1].Count() != 1 {
		t.Fatalf("the difference rendered the members or miscounted: %+v %+v", p2[0].Content, p2[1].Content)
	}
	add, del := p2[0].Changes(&p1[0].Content)
	if !slices.Equal(add, []string{"10.0.0.3"}) || !slices.Equal(del, []string{"10.0.0.1"}) || p2[0].elems != nil {
		t.Fatalf("changes from the base: add %v del %v (members rendered: %v)", add, del, p2[0].elems != nil)
	}
	unrelated := Fixed(map[string]bool{"10.0.0.9": true, "10.0.0.2": true})
	add, del = p2[0].Changes(&unrelated)
	if !slices.Equal(add, []string{"10.0.0.3"}) || !slices.Equal(del, []string{"10.0.0.9"}) {
		t.Fatalf("changes from an unrelated set: add %v del %v", add, del)
	}
	if add, del = p2[1].Changes(nil); !slices.Equal(add, []string{"fd00::1"}) || del != nil {
		t.Fatalf("changes from nothing: add %v del %v", add, del)
	}
}
