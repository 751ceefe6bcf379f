// Package nftjson reads what `nft -j list ...` prints: the one parser of nft's JSON for the
// agent's drift check, the CNI plugins' chain listing and masquerade's set read-back.
package nftjson

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/netwarden/netwarden/internal/kernel/netipx"
)

// Object is one entry of a listing: its kind ("table", "chain", "rule", "set", "map", ...)
// and its fields as nft printed them.
type Object struct {
	Kind   string
	Fields map[string]json.RawMessage
}

// Listing is a parsed `nft -j` document, in nft's order, without its metainfo.
type Listing []Object

// Parse reads a `nft -j` document.
func Parse(out []byte) (Listing, error) {
	var doc struct {
		Nftables []map[string]map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("nft JSON: %w", err)
	}
	var l Listing
	for _, entry := range doc.Nftables {
		for kind, fields := range entry {
			if kind != "metainfo" {
				l = append(l, Object{Kind: kind, Fields: fields})
			}
		}
	}
	return l, nil
}

// String is a string field, "" when absent.
func (o Object) String(field string) string {
	var s string
	_ = json.Unmarshal(o.Fields[field], &s)
	return s
}

// Elements are the elements of a set or map, each as nft printed it.
func (o Object) Elements() []json.RawMessage {
	var elems []json.RawMessage
	_ = json.Unmarshal(o.Fields["elem"], &elems)
	return elems
}

// Chains lists the names of the chains of table (any family), in listed order.
func (l Listing) Chains(table string) []string {
	var names []string
	for _, o := range l {
		if o.Kind == "chain" && o.String("table") == table {
			names = append(names, o.String("name"))
		}
	}
	return names
}

// Digest is a hash of the listing in a canonical form: handles dropped and each set's
// elements sorted, so that hash-set iteration order does not look like an edit. Rules keep
// their order within a chain.
func (l Listing) Digest() (string, error) {
	canon := make([]string, 0, len(l))
	for _, o := range l {
		fields := make(map[string]json.RawMessage, len(o.Fields))
		for k, v := range o.Fields {
			if k != "handle" {
				fields[k] = v
			}
		}
		if o.Kind == "set" || o.Kind == "map" {
			elems := o.Elements()
			keys := make([]string, len(elems))
			for i, e := range elems {
				keys[i] = string(e)
			}
			sort.Strings(keys)
			b, err := json.Marshal(keys)
			if err != nil {
				return "", err
			}
			fields["elem"] = b
		}
		b, err := json.Marshal(fields) // map keys come out sorted
		if err != nil {
			return "", err
		}
		canon = append(canon, o.Kind+":"+string(b))
	}
	sum := sha256.Sum256([]byte(strings.Join(canon, "\n")))
	return fmt.Sprintf("%x", sum[:]), nil
}

// AddressRange reads one element of an address set: "addr", {"prefix": {"addr", "len"}} or
// {"range": [first, last]}, possibly wrapped in {"elem": {"val": ...}} (an element with a
// comment or counter), as the first and last address it covers.
func AddressRange(raw json.RawMessage) (first, last netip.Addr, err error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return a, a, fmt.Errorf("element %q is not an address", s)
		}
		return a, a, nil
	}
	var obj struct {
		Prefix *struct {
			Addr string `json:"addr"`
			Len  int    `json:"len"`
		} `json:"prefix"`
		Range []json.RawMessage `json:"range"`
		Elem  *struct {
			Val json.RawMessage `json:"val"`
		} `json:"elem"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return first, last, fmt.Errorf("element %s: %w", raw, err)
	}
	switch {
	case obj.Prefix != nil:
		p, err := netip.ParsePrefix(fmt.Sprintf("%s/%d", obj.Prefix.Addr, obj.Prefix.Len))
		if err != nil {
			return first, last, fmt.Errorf("element %s is not a prefix", raw)
		}
		p = p.Masked()
		return p.Addr(), netipx.LastAddr(p), nil
	case len(obj.Range) == 2:
		first, _, err := AddressRange(obj.Range[0])
		if err != nil {
			return first, last, err
		}
		_, last, err := AddressRange(obj.Range[1])
		return first, last, err
	case obj.Elem != nil:
		return AddressRange(obj.Elem.Val)
	}
	return first, last, fmt.Errorf("element %s: not an address, prefix or range", raw)
}
