package policy

// FamilyView is one address family's share of a versioned, family-mixed set (an AddrSet or a
// NamedPortSet) as a backend renders it into a per-family kernel set: the difference from the
// previous version formatted at once (it is small), the whole member list only when asked for
// (it may be large, and an incremental sync never needs it).
type FamilyView struct {
	Added, Removed []string
	// Count is the number of members of this family.
	Count int
	// Members formats every member of this family.
	Members func() []string
}

// SplitByFamily returns the IPv4 (index 0) and IPv6 (index 1) views of a set whose elements
// are all, with added and removed the difference from the previous version. When withDelta is
// set, that version was rendered with prevCount members per family, so the counts follow from
// the difference without walking all.
func SplitByFamily[T any](all, added, removed []T, withDelta bool, prevCount [2]int,
	is6 func(T) bool, format func(T) string) [2]FamilyView {
	var views [2]FamilyView
	for fam := range views {
		v6 := fam == 1
		of := func(vs []T) []string {
			var out []string
			for _, v := range vs {
				if is6(v) == v6 {
					out = append(out, format(v))
				}
			}
			return out
		}
		v := &views[fam]
		v.Members = func() []string { return of(all) }
		if withDelta {
			v.Added, v.Removed = of(added), of(removed)
			v.Count = prevCount[fam] + len(v.Added) - len(v.Removed)
			continue
		}
		for _, e := range all {
			if is6(e) == v6 {
				v.Count++
			}
		}
	}
	return views
}
