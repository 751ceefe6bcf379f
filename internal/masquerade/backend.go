package masquerade

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
)

// The capabilities the agent finds by type assertion.
var (
	_ Backend                  = (*NFTables)(nil)
	_ Backend                  = (*IPTables)(nil)
	_ dataplane.KernelTables   = (*NFTables)(nil)
	_ dataplane.KernelTables   = (*IPTables)(nil)
	_ dataplane.AtomicFullSync = (*NFTables)(nil)
)

// Backend programs a Desired state into the kernel.
type Backend = dataplane.Backend[*Desired]

// setNames are the four address sets every backend keeps, in a fixed order.
type setKind struct {
	family int // 0 IPv4, 1 IPv6
	source bool
}

// name is the set's name in a backend whose source and destination sets are called src and
// dst, with the family as suffix.
func (k setKind) name(src, dst string) string {
	name := dst
	if k.source {
		name = src
	}
	if k.family == 1 {
		return name + "-v6"
	}
	return name + "-v4"
}

func (k setKind) ranges(d *Desired) []Range {
	if k.source {
		return d.Sources[k.family]
	}
	return d.NoMasquerade[k.family]
}

var setKinds = []setKind{{0, true}, {1, true}, {0, false}, {1, false}}

// rangeDiff returns what to add to and remove from have to make want.
func rangeDiff(have, want []Range) (add, remove []Range) {
	hs := make(map[Range]bool, len(have))
	for _, r := range have {
		hs[r] = true
	}
	ws := make(map[Range]bool, len(want))
	for _, r := range want {
		ws[r] = true
		if !hs[r] {
			add = append(add, r)
		}
	}
	for _, r := range have {
		if !ws[r] {
			remove = append(remove, r)
		}
	}
	return add, remove
}

// parseRange reads an element as nft or ipset print it: an address, a prefix or "a-b".
func parseRange(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if a, b, ok := strings.Cut(s, "-"); ok {
		first, err1 := netip.ParseAddr(strings.TrimSpace(a))
		last, err2 := netip.ParseAddr(strings.TrimSpace(b))
		if err1 != nil || err2 != nil {
			return Range{}, fmt.Errorf("element %q is not a range", s)
		}
		return Range{First: first, Last: last}, nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Range{}, fmt.Errorf("element %q is not a prefix", s)
		}
		return prefixRange(p), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return Range{}, fmt.Errorf("element %q is not an address", s)
	}
	return Range{First: a, Last: a}, nil
}

// canonical merges ranges, adjacent ones included, into the one form of the addresses they
// cover: the kernel (or ipset) may list what we sent split or joined differently.
func canonical(rs []Range, ipv6 bool) []Range {
	var ps []netip.Prefix
	for _, r := range rs {
		ps = append(ps, r.Prefixes()...)
	}
	return mergeRanges(ps, ipv6, true)
}

// sameAddresses reports whether the kernel's elements cover exactly the wanted addresses.
func sameAddresses(have, want []Range, ipv6 bool) bool {
	return slices.Equal(canonical(have, ipv6), canonical(want, ipv6))
}
