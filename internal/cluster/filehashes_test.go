package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
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

// TestFileHashesSHA256 checks the values sources give, hex SHA-256s (held in binary), beside
// other strings (held as given), through folds and JSON.
func TestFileHashesSHA256(t *testing.T) {
	sum := func(i int) string { s := sha256.Sum256([]byte(fmt.Sprint(i))); return hex.EncodeToString(s[:]) }
	want := map[string]string{"odd.yaml": "not-a-hash", "upper.yaml": strings.ToUpper(sum(-1))}
	for i := range 1000 {
		want[fmt.Sprintf("f%04d.yaml", i)] = sum(i)
	}
	f := FileHashesOf(want)
	if len(f.text) != 2 {
		t.Errorf("%d hashes held as text, want the 2 that are not lower-case hex SHA-256s", len(f.text))
	}
	for i := range 200 { // enough changes to fold
		name := fmt.Sprintf("f%04d.yaml", i)
		want[name] = sum(i + 5000)
		f = f.With(map[string]string{name: want[name]})
	}
	f = f.With(map[string]string{"f0999.yaml": "", "new.yaml": "also-odd"})
	delete(want, "f0999.yaml")
	want["new.yaml"] = "also-odd"
	if !maps.Equal(f.Map(), want) || f.Len() != len(want) {
		t.Fatalf("got %d files, want %d (maps equal: %v)", f.Len(), len(want), maps.Equal(f.Map(), want))
	}
	for name, h := range want {
		if got, ok := f.Get(name); !ok || got != h {
			t.Fatalf("Get(%s) = %q %v, want %q", name, got, ok, h)
		}
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	if err := json.Unmarshal(data, &m); err != nil || !maps.Equal(m, want) {
		t.Fatalf("JSON %s: %v", data, err)
	}
}
