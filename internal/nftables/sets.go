package nftables

import (
	"net/netip"
	"strconv"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/setdelta"
)

// set is a named set or verdict map with its elements. Keys and values are in nft syntax;
// a map element's value is its verdict. Elements of sets rendered from large peer sets are
// produced only when needed (a full sync, or a diff against an unrelated version): an
// incremental sync uses the difference from the version it replaced (see setdelta).
type set struct {
	typ      string
	interval bool
	// learned marks a DomainSet's set: flags timeout, its elements written by the learner
	// (internal/domains), never by a sync, and left out of drift checks.
	learned bool
	isMap   bool
	comment string
	setdelta.Content[string]
}

func newSet(typ, comment string, elems map[string]string) *set {
	return &set{typ: typ, comment: comment, Content: setdelta.Fixed(elems)}
}

// renderSets adds the sets of rs's peer sets to r.
func (rd *Renderer) renderSets(r *Rendered, rs *policy.Ruleset) {
	podSetOf := peerSetOf([2]string{"ipv4_addr", "ipv6_addr"}, "pod peers")
	portSetOf := peerSetOf([2]string{"ipv4_addr . inet_service", "ipv6_addr . inet_service"}, "named port")
	for name, as := range rs.AddrSets {
		pair := setdelta.Pair(rd.prev.addrSets, rd.cur.addrSets, setdelta.AddrSet(as), netip.Addr.String, "", podSetOf)
		r.Sets[name+"-v4"], r.Sets[name+"-v6"] = pair[0], pair[1]
	}
	for name, cs := range rs.CIDRSets {
		s, ok := rd.prev.cidrSets[cs]
		if !ok {
			elems := map[string]string{}
			for _, p := range cs.Prefixes {
				elems[prefixElement(p)] = ""
			}
			typ := "ipv4_addr"
			if cs.IPv6 {
				typ = "ipv6_addr"
			}
			s = newSet(typ, "ipBlock", elems)
			s.interval = true
		}
		rd.cur.cidrSets[cs] = s
		r.Sets[name] = s
	}
	for name, ds := range rs.DomainSets {
		for _, v6 := range []bool{false, true} {
			typ := "ipv4_addr"
			if v6 {
				typ = "ipv6_addr"
			}
			r.Sets[name+famSuffix(v6)] = &set{typ: typ, learned: true, comment: "domain " + ds.Pattern, Content: setdelta.Fixed[string](nil)}
		}
	}
	for name, ns := range rs.NamedPortSets {
		element := func(e netip.AddrPort) string { return e.Addr().String() + " . " + strconv.Itoa(int(e.Port())) }
		pair := setdelta.Pair(rd.prev.namedSets, rd.cur.namedSets, setdelta.NamedPortSet(ns), element, "", portSetOf)
		r.Sets[name+"-v4"], r.Sets[name+"-v6"] = pair[0], pair[1]
	}
}

// peerSetOf returns what makes the set of one family, of type types[0] (IPv4) or types[1]
// (IPv6), around the content setdelta.Pair renders.
func peerSetOf(types [2]string, comment string) func(v6 bool, c setdelta.Content[string]) *set {
	return func(v6 bool, c setdelta.Content[string]) *set {
		typ := types[0]
		if v6 {
			typ = types[1]
		}
		return &set{typ: typ, comment: comment, Content: c}
	}
}

func prefixElement(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}
