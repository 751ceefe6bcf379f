package nftjson

import (
	"encoding/json"
	"strings"
	"testing"
)

// A listing as nft 1.0.6 prints `nft -j list table inet t`.
const listing = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "inet", "name": "t", "handle": 1}},
{"set": {"family": "inet", "name": "s", "table": "t", "type": "ipv4_addr", "handle": 2, "flags": ["interval"],
  "elem": [{"prefix": {"addr": "10.0.0.0", "len": 8}}, {"range": ["192.0.2.1", "192.0.2.9"]}, "198.51.100.7",
           {"elem": {"val": {"prefix": {"addr": "203.0.113.0", "len": 24}}, "comment": "c"}}]}},
{"chain": {"family": "inet", "table": "t", "name": "c", "handle": 3}},
{"chain": {"family": "inet", "table": "other", "name": "x", "handle": 4}},
{"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 5, "expr": [{"accept": null}]}}]}`

func TestParse(t *testing.T) {
	l, err := Parse([]byte(listing))
	if err != nil {
		t.Fatal(err)
	}
	kinds := make([]string, len(l))
	for i, o := range l {
		kinds[i] = o.Kind
	}
	if got := strings.Join(kinds, ","); got != "table,set,chain,chain,rule" {
		t.Fatalf("kinds %s", got)
	}
	if got := l.Chains("t"); len(got) != 1 || got[0] != "c" {
		t.Fatalf("chains of t: %v", got)
	}
	want := []string{"10.0.0.0-10.255.255.255", "192.0.2.1-192.0.2.9", "198.51.100.7-198.51.100.7", "203.0.113.0-203.0.113.255"}
	for i, raw := range l[1].Elements() {
		first, last, err := AddressRange(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := first.String() + "-" + last.String(); got != want[i] {
			t.Errorf("element %s: %s, want %s", raw, got, want[i])
		}
	}
	if _, _, err := AddressRange(json.RawMessage(`{"set": 1}`)); err == nil {
		t.Error("an element that is no address was read")
	}
	if _, err := Parse([]byte(`{"nftables": [`)); err == nil {
		t.Error("a cut listing parsed")
	}
}

// TestDigest: handles and the order of a set's elements do not change the digest; a rule's
// content does.
func TestDigest(t *testing.T) {
	digest := func(doc string) string {
		l, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := digest(listing)
	reordered := strings.Replace(listing, `{"range": ["192.0.2.1", "192.0.2.9"]}, "198.51.100.7"`, `"198.51.100.7", {"range": ["192.0.2.1", "192.0.2.9"]}`, 1)
	rehandled := strings.Replace(listing, `"handle": 5`, `"handle": 50`, 1)
	edited := strings.Replace(listing, `{"accept": null}`, `{"drop": null}`, 1)
	if reordered == listing || rehandled == listing || edited == listing {
		t.Fatal("a replacement did not apply")
	}
	if digest(reordered) != base || digest(rehandled) != base {
		t.Error("element order or handles changed the digest")
	}
	if digest(edited) == base {
		t.Error("an edited rule kept the digest")
	}
}
