package policy

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// addrSetDef defines a pod peer set: the pods a (namespaceSelector, podSelector) pair selects
// from a policy in policyNS. Identical pairs share one set.
type addrSetDef struct {
	name     string
	policyNS string          // the namespace searched when nsSel is nil
	nsSel    *parsedSelector // nil: the policy's own namespace
	podSel   parsedSelector
}

func (cc *Compiler) addrSetDef(policyNS string, nsSel, podSel *metav1.LabelSelector) addrSetDef {
	d := addrSetDef{policyNS: policyNS, podSel: parsedSelector{sel: labels.Everything()}}
	key := "ns=" + policyNS
	if nsSel != nil {
		p := cc.sels.get(nsSel)
		d.nsSel = &p
		key = "nssel=" + p.key
	}
	if podSel != nil {
		d.podSel = cc.sels.get(podSel)
	}
	d.name = "pods-" + shortHash(key+"|pods="+d.podSel.key)
	return d
}

func (d addrSetDef) matches(pi *podInfo, nsLabels map[string]labels.Set) bool {
	if d.nsSel == nil {
		if pi.pod.Namespace != d.policyNS {
			return false
		}
	} else if !d.nsSel.sel.Matches(nsLabels[pi.pod.Namespace]) {
		return false
	}
	return d.podSel.sel.Matches(pi.labels)
}

type addrSetState struct {
	def       addrSetDef
	members   map[string][]netip.Addr // pod key -> its IPs
	content   *multiset[netip.Addr]
	published *AddrSet
}

func newAddrSetState(d addrSetDef) *addrSetState {
	return &addrSetState{def: d, members: map[string][]netip.Addr{}, content: newMultiset(netip.Addr.Compare)}
}

func (s *addrSetState) setMember(key string, ips []netip.Addr) {
	for _, ip := range s.members[key] {
		s.content.remove(ip)
	}
	if ips == nil {
		delete(s.members, key)
	} else {
		s.members[key] = ips
	}
	for _, ip := range ips {
		s.content.add(ip)
	}
}

func (s *addrSetState) publish() {
	next := &AddrSet{Addrs: cloneOrNil(s.content.sorted)}
	if prev := s.published; prev != nil {
		next.Prev = prev
		next.Added, next.Removed = s.content.takeDelta()
		prev.Prev, prev.Added, prev.Removed = nil, nil, nil
	}
	s.content.takeDelta()
	s.published = next
}

// namedSetDef defines the (pod IP, port) pairs a named port resolves to for one protocol.
type namedSetDef struct {
	name     string
	portName string
	proto    corev1.Protocol
}

func (d namedSetDef) entries(pi *podInfo) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ctr := range pi.pod.Spec.Containers {
		for _, cp := range ctr.Ports {
			proto := cp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			if cp.Name != d.portName || proto != d.proto {
				continue
			}
			for _, ip := range pi.ips {
				out = append(out, netip.AddrPortFrom(ip, uint16(cp.ContainerPort)))
			}
		}
	}
	return out
}

type namedSetState struct {
	def       namedSetDef
	members   map[string][]netip.AddrPort
	content   *multiset[netip.AddrPort]
	published *NamedPortSet
}

func newNamedSetState(d namedSetDef) *namedSetState {
	return &namedSetState{def: d, members: map[string][]netip.AddrPort{}, content: newMultiset(netip.AddrPort.Compare)}
}

func (s *namedSetState) setMember(key string, entries []netip.AddrPort) {
	for _, e := range s.members[key] {
		s.content.remove(e)
	}
	if entries == nil {
		delete(s.members, key)
	} else {
		s.members[key] = entries
	}
	for _, e := range entries {
		s.content.add(e)
	}
}

func (s *namedSetState) publish() {
	next := &NamedPortSet{Entries: cloneOrNil(s.content.sorted)}
	if prev := s.published; prev != nil {
		next.Prev = prev
		next.Added, next.Removed = s.content.takeDelta()
		prev.Prev, prev.Added, prev.Removed = nil, nil, nil
	}
	s.content.takeDelta()
	s.published = next
}

// multiset keeps a sorted list of distinct values with a count each (two pods can briefly
// share an IP), and the values that appeared or disappeared since the last takeDelta.
type multiset[T comparable] struct {
	cmp            func(a, b T) int
	count          map[T]int
	sorted         []T
	added, removed map[T]bool
}

func newMultiset[T comparable](cmp func(a, b T) int) *multiset[T] {
	return &multiset[T]{cmp: cmp, count: map[T]int{}, added: map[T]bool{}, removed: map[T]bool{}}
}

func (m *multiset[T]) add(v T) {
	m.count[v]++
	if m.count[v] > 1 {
		return
	}
	i, _ := slices.BinarySearchFunc(m.sorted, v, m.cmp)
	m.sorted = slices.Insert(m.sorted, i, v)
	if m.removed[v] {
		delete(m.removed, v)
	} else {
		m.added[v] = true
	}
}

func (m *multiset[T]) remove(v T) {
	if m.count[v]--; m.count[v] > 0 {
		return
	}
	delete(m.count, v)
	if i, ok := slices.BinarySearchFunc(m.sorted, v, m.cmp); ok {
		m.sorted = slices.Delete(m.sorted, i, i+1)
	}
	if m.added[v] {
		delete(m.added, v)
	} else {
		m.removed[v] = true
	}
}

// build fills an empty multiset in one sort, where adding values one by one would move the
// sorted slice for each.
func (m *multiset[T]) build(values []T) {
	for _, v := range values {
		m.count[v]++
	}
	m.sorted = slices.Clone(values)
	slices.SortFunc(m.sorted, m.cmp)
	m.sorted = slices.Compact(m.sorted)
}

func (m *multiset[T]) dirty() bool { return len(m.added)+len(m.removed) > 0 }

// takeDelta returns and forgets the pending difference, each side sorted.
func (m *multiset[T]) takeDelta() (added, removed []T) {
	for v := range m.added {
		added = append(added, v)
	}
	for v := range m.removed {
		removed = append(removed, v)
	}
	slices.SortFunc(added, m.cmp)
	slices.SortFunc(removed, m.cmp)
	clear(m.added)
	clear(m.removed)
	return added, removed
}

// computeAddrSet evaluates a set from scratch over the pods of the namespaces it can match.
func (cc *Compiler) computeAddrSet(d addrSetDef, nsMatches map[string][]string) *addrSetState {
	st := newAddrSetState(d)
	namespaces := []string{d.policyNS}
	if d.nsSel != nil {
		var ok bool
		if namespaces, ok = nsMatches[d.nsSel.key]; !ok {
			namespaces = nil
			for ns := range cc.byNS {
				if d.nsSel.sel.Matches(cc.nsLabels[ns]) {
					namespaces = append(namespaces, ns)
				}
			}
			nsMatches[d.nsSel.key] = namespaces
		}
	}
	var all []netip.Addr
	for _, ns := range namespaces {
		for key, pi := range cc.byNS[ns] {
			if d.podSel.sel.Matches(pi.labels) {
				st.members[key] = pi.ips
				all = append(all, pi.ips...)
			}
		}
	}
	st.content.build(all)
	return st
}

// updateSets publishes every set the compiled policies use. A set whose inputs did not change
// keeps its published value; one touched by a changed pod is updated from that pod alone; a
// new set, or every set after a namespace change or a burst of pod changes, is computed from
// scratch. It returns how many sets were computed from scratch.
func (cc *Compiler) updateSets(rs *Ruleset, addrDefs map[string]addrSetDef, namedDefs map[string]namedSetDef, changes []podChange, nsChanged bool) int {
	bulk := len(changes) > len(cc.pods)/4+16
	nsMatches := map[string][]string{}
	recomputed := 0

	addr := make(map[string]*addrSetState, len(addrDefs))
	for name, d := range addrDefs {
		st := cc.addrSets[name]
		if st == nil || bulk || (nsChanged && d.nsSel != nil) {
			fresh := cc.computeAddrSet(d, nsMatches)
			recomputed++
			if st == nil {
				fresh.publish()
				st = fresh
			} else {
				// Recomputed from scratch, but published as a difference from what the
				// previous version held.
				st.replaceWith(fresh)
			}
		} else {
			for _, ch := range changes {
				old, was := st.members[ch.key]
				now := ch.new != nil && d.matches(ch.new, cc.nsLabels)
				switch {
				case was && now && slices.Equal(old, ch.new.ips):
				case now:
					st.setMember(ch.key, ch.new.ips)
				case was:
					st.setMember(ch.key, nil)
				}
			}
		}
		if st.content.dirty() {
			st.publish()
		}
		addr[name] = st
		rs.AddrSets[name] = st.published
	}
	cc.addrSets = addr

	named := make(map[string]*namedSetState, len(namedDefs))
	for name, d := range namedDefs {
		st := cc.namedSets[name]
		if st == nil || bulk {
			fresh := newNamedSetState(d)
			var all []netip.AddrPort
			for key, pi := range cc.byPort[d.portName] {
				if e := d.entries(pi); len(e) > 0 {
					fresh.members[key] = e
					all = append(all, e...)
				}
			}
			fresh.content.build(all)
			recomputed++
			if st == nil {
				fresh.publish()
				st = fresh
			} else {
				st.replaceWith(fresh)
			}
		} else {
			for _, ch := range changes {
				old, was := st.members[ch.key]
				var now []netip.AddrPort
				if ch.new != nil {
					now = d.entries(ch.new)
				}
				switch {
				case was && slices.Equal(old, now):
				case len(now) > 0:
					st.setMember(ch.key, now)
				case was:
					st.setMember(ch.key, nil)
				}
			}
		}
		if st.content.dirty() {
			st.publish()
		}
		named[name] = st
		rs.NamedPortSets[name] = st.published
	}
	cc.namedSets = named

	for name := range cc.cidrSets {
		if _, ok := rs.CIDRSets[name]; !ok {
			delete(cc.cidrSets, name)
		}
	}
	return recomputed
}

// replaceWith takes fresh's members while recording the difference from the current content.
func (s *addrSetState) replaceWith(fresh *addrSetState) {
	for key := range s.members {
		if _, ok := fresh.members[key]; !ok {
			s.setMember(key, nil)
		}
	}
	for key, ips := range fresh.members {
		if !slices.Equal(s.members[key], ips) {
			s.setMember(key, ips)
		}
	}
	s.def = fresh.def
}

func (s *namedSetState) replaceWith(fresh *namedSetState) {
	for key := range s.members {
		if _, ok := fresh.members[key]; !ok {
			s.setMember(key, nil)
		}
	}
	for key, e := range fresh.members {
		if !slices.Equal(s.members[key], e) {
			s.setMember(key, e)
		}
	}
	s.def = fresh.def
}

func cloneOrNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}
