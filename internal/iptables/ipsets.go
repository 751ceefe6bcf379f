package iptables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/setdelta"
	"github.com/netwarden/netwarden/internal/sortedset"
)

// ipset is one kernel set with its members in `ipset save` syntax (the value of every member
// is true). Members of large peer sets are produced only when needed; an incremental sync uses
// the difference from the version it replaced (see setdelta).
type ipset struct {
	typ string // hash:ip, hash:net or hash:ip,port
	v6  bool
	// domainSet names the DomainSet whose addresses the set holds: its members are the
	// learner's (internal/domains), with timeouts, never a sync's, and not checked for drift.
	domainSet string
	setdelta.Content[bool]
}

func (s *ipset) createLine(name string) string {
	fam := "inet"
	if s.v6 {
		fam = "inet6"
	}
	// Sized for about four members a bucket: most sets are small, and ipset grows a set's
	// table itself when members are added later.
	hashsize := 64
	for hashsize < 65536 && hashsize*4 < s.Count() {
		hashsize *= 2
	}
	// An ipBlock's set never changes (its name stands for its content), so it is made as
	// large as it needs: some ten thousand excepts cut a /0 into more than a million prefixes.
	maxelem := maxSetElements
	if s.typ == "hash:net" {
		maxelem = max(maxelem, s.Count())
	}
	line := fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d", name, s.typ, fam, hashsize, maxelem)
	if s.domainSet != "" {
		line += " timeout 0 comment" // members carry their own timeouts and the answer behind them
	}
	return line
}

// maxSetElements is the maxelem of every set of pods: ipset refuses a member beyond it ("Hash
// is full"), and a set's limit cannot change once the rules reference it.
const maxSetElements = 1 << 20

// policyChecker returns the check of policy.FailClosed for rs: a policy whose pod or
// named-port sets need more members than such a set may hold cannot be expressed. That takes
// a million pods.
func policyChecker(rs *policy.Ruleset) func(string, *policy.PolicyRules) error {
	tooMany := func(kind, name string, n int) error {
		return fmt.Errorf("its %s %s needs %d members in one ipset, more than the %d a set holds", kind, name, n, maxSetElements)
	}
	return func(_ string, pr *policy.PolicyRules) error {
		for _, r := range pr.Rules {
			for _, p := range r.Peers {
				if p.AddrSet == "" {
					continue
				}
				if n := largestFamily(rs.AddrSets[p.AddrSet].Addrs, netip.Addr.Is6); n > maxSetElements {
					return tooMany("peer set", p.AddrSet, n)
				}
			}
			for _, pm := range r.Ports {
				if pm.NamedPortSet == "" {
					continue
				}
				is6 := func(e netip.AddrPort) bool { return e.Addr().Is6() }
				if n := largestFamily(rs.NamedPortSets[pm.NamedPortSet].Entries, is6); n > maxSetElements {
					return tooMany("named port set", pm.NamedPortSet, n)
				}
			}
		}
		return nil
	}
}

// largestFamily returns how many members the larger family's set of all needs. The sets are
// counted only when both together could be too many.
func largestFamily[T sortedset.Ordered[T]](all sortedset.Set[T], is6 func(T) bool) int {
	if all.Len() <= maxSetElements {
		return all.Len()
	}
	n6 := 0
	for v := range all.All() {
		if is6(v) {
			n6++
		}
	}
	return max(n6, all.Len()-n6)
}

// namedPortProto recovers the protocol of a named-port set from its Ruleset name
// ("port-<name>-<proto>"), which ipset needs in every member.
func namedPortProto(name string) string {
	i := strings.LastIndexByte(name, '-')
	return name[i+1:]
}

// prefixMember spells a prefix as `ipset save` lists it in a hash:net set.
func prefixMember(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

// renderSets adds the ipsets of rs's peer sets to r. Policy rules name their sets through the
// hash of the Ruleset name; the sources are recorded here, where each name is known, so
// collisions are found.
func (rd *Renderer) renderSets(r *Rendered, rs *policy.Ruleset) {
	podSetOf, portSetOf := ipsetOf("hash:ip"), ipsetOf("hash:ip,port")
	for name, as := range rs.AddrSets {
		pair := setdelta.Pair(rd.prev.addrSets, rd.cur.addrSets, setdelta.AddrSet(as), netip.Addr.String, true, podSetOf)
		r.Sets[r.name(podSet(name, v4), name)], r.Sets[r.name(podSet(name, v6), name)] = pair[0], pair[1]
	}
	for name, cs := range rs.CIDRSets {
		s, ok := rd.prev.cidrSets[cs]
		if !ok {
			elems := map[string]bool{}
			for _, p := range cs.Prefixes {
				for _, m := range xtables.HashNetPrefixes(p) {
					elems[prefixMember(m)] = true
				}
			}
			s = &ipset{typ: "hash:net", v6: cs.IPv6, Content: setdelta.Fixed(elems)}
		}
		rd.cur.cidrSets[cs] = s
		fam := v4
		if cs.IPv6 {
			fam = v6
		}
		r.Sets[r.name(cidrSet(name, fam), name)] = s
	}
	for name := range rs.DomainSets {
		for _, fam := range []int{v4, v6} {
			r.Sets[r.name(domainSetName(name, fam), name)] = &ipset{typ: "hash:ip", v6: fam == v6, domainSet: name, Content: setdelta.Fixed[bool](nil)}
		}
	}
	for name, ns := range rs.NamedPortSets {
		proto := namedPortProto(name)
		member := func(e netip.AddrPort) string {
			return e.Addr().String() + "," + proto + ":" + strconv.Itoa(int(e.Port()))
		}
		pair := setdelta.Pair(rd.prev.namedSets, rd.cur.namedSets, setdelta.NamedPortSet(ns), member, true, portSetOf)
		r.Sets[r.name(portSet(name, v4), name)], r.Sets[r.name(portSet(name, v6), name)] = pair[0], pair[1]
	}
}

// ipsetOf returns what makes an ipset of type typ around the content setdelta.Pair renders.
func ipsetOf(typ string) func(v6 bool, c setdelta.Content[bool]) *ipset {
	return func(v6 bool, c setdelta.Content[bool]) *ipset { return &ipset{typ: typ, v6: v6, Content: c} }
}
