// Package setdelta is what the nftables and iptables renderers share in turning the peer sets
// of a policy.Ruleset into kernel sets and in diffing two renderings of one. A versioned set
// (policy.AddrSet, policy.NamedPortSet) that replaced a version the renderer rendered last
// time is rendered, per address family, as the difference from that rendering; its full
// content is produced only when a full sync, or a diff against an unrelated rendering, asks
// for it. An incremental sync thus costs what changed, not the size of the set. Each backend
// keeps only its syntax: how an element is spelled, and what a kernel set is besides its
// elements.
package setdelta

import (
	"iter"
	"maps"
	"net/netip"
	"slices"

	"github.com/netwarden/netwarden/internal/policy"
)

// Content is the elements of one kernel set or verdict map, keyed in the backend's syntax;
// V is the value of an element (a map element's verdict; a set's elements all have the same
// one). A backend's set embeds it.
type Content[V comparable] struct {
	count       int
	elems       map[string]V
	materialize func() map[string]V

	// src identifies the value this content was rendered from; base, when set, the value
	// whose rendering this one differs from by added and removed.
	src, base      any
	added, removed []string
}

// Fixed is content given in full.
func Fixed[V comparable](elems map[string]V) Content[V] {
	return Content[V]{count: len(elems), elems: elems}
}

// Count is the number of elements, known without producing them.
func (c *Content[V]) Count() int { return c.count }

// Elements returns every element with its value, producing them on first use.
func (c *Content[V]) Elements() map[string]V {
	if c.elems == nil {
		if c.materialize != nil {
			c.elems = c.materialize()
		} else {
			c.elems = map[string]V{}
		}
	}
	return c.elems
}

// Keys returns every element in order, as a full sync writes them.
func (c *Content[V]) Keys() []string { return slices.Sorted(maps.Keys(c.Elements())) }

// Changes returns the elements to delete from old and those to add to it for it to hold c's
// (a map element whose value changed is in both). When c was rendered as the difference from
// the value old was rendered from, that difference is the answer, in the order it was given,
// and no full content is produced; otherwise the contents are compared, and each list is
// sorted. A nil old holds nothing.
func (c *Content[V]) Changes(old *Content[V]) (add, del []string) {
	if old == nil {
		return c.Keys(), nil
	}
	if c.base != nil && c.base == old.src {
		return c.added, c.removed
	}
	now, was := c.Elements(), old.Elements()
	for k, v := range was {
		if nv, ok := now[k]; !ok || nv != v {
			del = append(del, k)
		}
	}
	for k, v := range now {
		if ov, ok := was[k]; !ok || ov != v {
			add = append(add, k)
		}
	}
	slices.Sort(add)
	slices.Sort(del)
	return add, del
}

// Version is one published value of a family-mixed versioned set, as the renderers read it:
// K identifies a value (its pointer), T is a member.
type Version[K comparable, T any] struct {
	Value, Prev    K // Prev is the value Value replaced
	All            iter.Seq[T]
	Added, Removed []T
	Is6            func(T) bool
}

// AddrSet is s as a Version.
func AddrSet(s *policy.AddrSet) Version[*policy.AddrSet, netip.Addr] {
	return Version[*policy.AddrSet, netip.Addr]{Value: s, Prev: s.Prev, All: s.Addrs.All(), Added: s.Added, Removed: s.Removed, Is6: netip.Addr.Is6}
}

// NamedPortSet is s as a Version.
func NamedPortSet(s *policy.NamedPortSet) Version[*policy.NamedPortSet, netip.AddrPort] {
	return Version[*policy.NamedPortSet, netip.AddrPort]{Value: s, Prev: s.Prev, All: s.Entries.All(), Added: s.Added, Removed: s.Removed,
		Is6: func(e netip.AddrPort) bool { return e.Addr().Is6() }}
}

// Set is what Pair needs of a backend's kernel set, which embeds a Content: its count.
type Set interface{ Count() int }

// Pair returns the IPv4 (index 0) and IPv6 kernel sets of v, and records them in cur, the
// renderer's sets of this kind by value for the render under way; prev holds those of the
// last render. A value the last render rendered comes out as the same pointers, which a diff
// skips without looking at elements. A value that replaced one the last render rendered is
// rendered as the difference from those sets: only the difference is formatted, and the
// counts follow from it. Any other is rendered with its members formatted only when asked
// for. format spells a member as an element, value is every element's value, and newSet
// makes the backend's set of one family around its content.
func Pair[K comparable, T any, V comparable, S Set](prev, cur map[K][2]S, v Version[K, T],
	format func(T) string, value V, newSet func(v6 bool, c Content[V]) S) [2]S {
	pair, ok := prev[v.Value]
	if !ok {
		base, hasBase := prev[v.Prev]
		var prevCount [2]int
		if hasBase {
			prevCount = [2]int{base[0].Count(), base[1].Count()}
		}
		for fam, view := range splitByFamily(v.All, v.Added, v.Removed, hasBase, prevCount, v.Is6, format) {
			c := Content[V]{count: view.count, src: v.Value}
			c.materialize = func() map[string]V {
				m := map[string]V{}
				for _, e := range view.members() {
					m[e] = value
				}
				return m
			}
			if hasBase {
				c.base = v.Prev
				c.added, c.removed = view.added, view.removed
			}
			pair[fam] = newSet(fam == 1, c)
		}
	}
	cur[v.Value] = pair
	return pair
}

// familyView is one address family's share of a versioned, family-mixed set: the difference
// from the previous version formatted at once (it is small), the whole member list only when
// asked for (it may be large, and an incremental sync never needs it).
type familyView struct {
	added, removed []string
	count          int // members of this family
	members        func() []string
}

// splitByFamily returns the IPv4 (index 0) and IPv6 (index 1) views of a set whose elements
// are all, with added and removed the difference from the previous version. When withDelta is
// set, that version was rendered with prevCount members per family, so the counts follow from
// the difference without walking all.
func splitByFamily[T any](all iter.Seq[T], added, removed []T, withDelta bool, prevCount [2]int,
	is6 func(T) bool, format func(T) string) [2]familyView {
	var views [2]familyView
	for fam := range views {
		v6 := fam == 1
		of := func(vs iter.Seq[T]) []string {
			var out []string
			for v := range vs {
				if is6(v) == v6 {
					out = append(out, format(v))
				}
			}
			return out
		}
		v := &views[fam]
		v.members = func() []string { return of(all) }
		if withDelta {
			v.added, v.removed = of(slices.Values(added)), of(slices.Values(removed))
			v.count = prevCount[fam] + len(v.added) - len(v.removed)
			continue
		}
		for e := range all {
			if is6(e) == v6 {
				v.count++
			}
		}
	}
	return views
}
