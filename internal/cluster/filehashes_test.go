package cluster

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// TestFileHashesAgainstAMap applies random changes (adds, updates, removals, removals of files
// never there) and checks every value against a plain map, including every earlier value, which
// must not change, and its JSON.
func TestFileHashesAgainstAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var values []FileHashes
	var wants []map[string]string
	cur, want := FileHashes{}, map[string]string{}
	for step := range 2000 {
		changes := map[string]string{}
		for range 1 + rng.IntN(map[bool]int{false: 4, true: 300}[step%97 == 0]) {
			name := fmt.Sprintf("f%d.yaml", rng.IntN(600))
			if rng.IntN(3) == 0 {
				changes[name] = ""
			} else {
				changes[name] = fmt.Sprintf("%x", rng.Uint64())
			}
		}
		cur = cur.With(changes)
		want = maps.Clone(want)
		for name, h := range changes {
			if h == "" {
				delete(want, name)
			} else {
				want[name] = h
			}
		}
		values, wants = append(values, cur), append(wants, want)
	}
	for i, v := range values {
		w := wants[i]
		if v.Len() != len(w) || !maps.Equal(v.Map(), w) {
			t.Fatalf("value %d: %d files %v, want %d %v", i, v.Len(), v.Map(), len(w), w)
		}
		for name, h := range w {
			if got, ok := v.Get(name); !ok || got != h {
				t.Fatalf("value %d: Get(%s) = %q %v, want %q", i, name, got, ok, h)
			}
		}
		if _, ok := v.Get("never.yaml"); ok {
			t.Fatalf("value %d holds a file never set", i)
		}
	}
	last := values[len(values)-1]
	data, err := json.Marshal(last)
	if err != nil {
		t.Fatal(err)
	}
	var back FileHashes
	if err := json.Unmarshal(data, &back); err != nil || !back.Equal(last) || !last.Equal(back) {
		t.Fatalf("JSON round trip: %v, equal %v", err, back.Equal(last))
	}
	if values[0].Equal(last) {
		t.Fatal("Equal says different values are equal")
	}
	if data, _ := json.Marshal(Revision{}); string(data) != "{}" {
		t.Errorf("an empty Revision encodes as %s", data)
	}
}
