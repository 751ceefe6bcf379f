package policy

import (
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/sortedset"
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
	return d.podSel.sel.Matches(pi.labels())
}

// setValue is what a peer or named-port set holds: netip.Addr or netip.AddrPort.
type setValue[T any] interface {
	comparable
	sortedset.Ordered[T]
}

func newMultiset[T setValue[T]]() *multiset[T] {
	return &multiset[T]{extra: map[T]int{}, added: map[T]bool{}, removed: map[T]bool{}}
}

// apply updates the content for the changed pods; valuesOf gives a pod's values, nil when it
// does not belong. Each change takes out what its previous version gave and puts in what the
// new one gives: what a pod contributed is not kept, since it follows from that version under
// the namespace labels the set was last computed with (a namespace change recomputes every set
// that reads them). A map of every pod's contribution was tens of megabytes at 150,000 pods.
func (m *multiset[T]) apply(changes []podChange, valuesOf func(*podInfo) []T) {
	for _, ch := range changes {
		var old, now []T
		if ch.old != nil {
			old = valuesOf(ch.old)
		}
		if ch.new != nil {
			now = valuesOf(ch.new)
		}
		if slices.Equal(old, now) {
			continue
		}
		for _, v := range old {
			m.remove(v)
		}
		for _, v := range now {
			m.add(v)
		}
	}
}

// version returns the content to publish and the difference since the last version. The
// content shares its chunks with the multiset, which copies a chunk before it next changes
// it: a set of every pod's port at 150,000 pods is megabytes, and is published at every sync
// that changes it.
func (m *multiset[T]) version() (values sortedset.Set[T], added, removed []T) {
	added, removed = m.takeDelta()
	return m.sorted.Set(), added, removed
}

// replaceWith makes all (as build takes it) the content, recording the difference from the
// current content, so a set recomputed from scratch is still published as a delta.
func (m *multiset[T]) replaceWith(all []T) {
	fresh := multiset[T]{extra: map[T]int{}}
	fresh.build(all)
	was, now := m.sorted.Set(), fresh.sorted.Set()
	for v := range now.All() {
		if !was.Contains(v) {
			m.appeared(v)
		}
	}
	for v := range was.All() {
		if !now.Contains(v) {
			m.disappeared(v)
		}
	}
	m.sorted, m.extra = fresh.sorted, fresh.extra
}

type addrSetState struct {
	def addrSetDef
	*multiset[netip.Addr]
	published *AddrSet
}

func (s *addrSetState) publish() {
	next := &AddrSet{}
	next.Addrs, next.Added, next.Removed = s.version()
	if prev := s.published; prev != nil {
		next.Prev = prev
		prev.Prev, prev.Added, prev.Removed = nil, nil, nil // keep one link, so old versions can go
	} else {
		next.Added, next.Removed = nil, nil
	}
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
	for _, cp := range pi.pod.Ports {
		proto := cp.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		if cp.Name != d.portName || proto != d.proto {
			continue
		}
		for _, ip := range pi.ips() {
			out = append(out, netip.AddrPortFrom(ip, uint16(cp.Port)))
		}
	}
	return out
}

type namedSetState struct {
	def namedSetDef
	*multiset[netip.AddrPort]
	published *NamedPortSet
}

func (s *namedSetState) publish() {
	next := &NamedPortSet{}
	next.Entries, next.Added, next.Removed = s.version()
	if prev := s.published; prev != nil {
		next.Prev = prev
		prev.Prev, prev.Added, prev.Removed = nil, nil, nil
	} else {
		next.Added, next.Removed = nil, nil
	}
	s.published = next
}

// multiset keeps a sorted set of distinct values, how many times more than once a value is
// held (two pods can briefly share an IP: rare, so only those values are counted, where a count
// of every value cost a map entry per pod of the cluster), and the values that appeared or
// disappeared since the last takeDelta.
type multiset[T setValue[T]] struct {
	sorted         sortedset.Builder[T]
	extra          map[T]int
	added, removed map[T]bool
}

func (m *multiset[T]) add(v T) {
	if !m.sorted.Insert(v) {
		m.extra[v]++
		return
	}
	m.appeared(v)
}

func (m *multiset[T]) remove(v T) {
	if n := m.extra[v]; n > 0 {
		if n == 1 {
			delete(m.extra, v)
		} else {
			m.extra[v] = n - 1
		}
		return
	}
	if m.sorted.Delete(v) {
		m.disappeared(v)
	}
}

// appeared and disappeared record a value that came into or went out of the content, for the
// next takeDelta; a value that came and went since the last one is no difference.
func (m *multiset[T]) appeared(v T) {
	if m.removed[v] {
		delete(m.removed, v)
	} else {
		m.added[v] = true
	}
}

func (m *multiset[T]) disappeared(v T) {
	if m.added[v] {
		delete(m.added, v)
	} else {
		m.removed[v] = true
	}
}

// build fills an empty multiset in one sort, where adding values one by one would search for
// each. It takes values over.
func (m *multiset[T]) build(values []T) {
	slices.SortFunc(values, func(a, b T) int { return a.Compare(b) })
	for i := 1; i < len(values); i++ {
		if values[i] == values[i-1] {
			m.extra[values[i]]++
		}
	}
	m.sorted.Reset(values)
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
	cmp := func(a, b T) int { return a.Compare(b) }
	slices.SortFunc(added, cmp)
	slices.SortFunc(removed, cmp)
	clear(m.added)
	clear(m.removed)
	return added, removed
}

// addrSetMembers evaluates a set from scratch over the pods of the namespaces it can match.
func (cc *Compiler) addrSetMembers(d addrSetDef, nsMatches map[string][]string) []netip.Addr {
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
	var out []netip.Addr
	for _, ns := range namespaces {
		for _, pi := range cc.byNS[ns] {
			if d.podSel.sel.Matches(pi.labels()) {
				out = append(out, pi.ips()...)
			}
		}
	}
	return out
}

func (cc *Compiler) namedSetMembers(d namedSetDef, byPort map[string][]*podInfo) []netip.AddrPort {
	var out []netip.AddrPort
	for _, pi := range byPort[d.portName] {
		out = append(out, d.entries(pi)...)
	}
	return out
}

func portNamed(ports []cluster.ContainerPort, name string) bool {
	for _, p := range ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// podsByPort returns the eligible pods with a container port of each name of jobs. It is made
// for the named sets computed from scratch, seldom, in one walk of the pods: an index kept up to
// date would hold an entry for most pods of the cluster.
func (cc *Compiler) podsByPort(jobs []namedSetDef) map[string][]*podInfo {
	if len(jobs) == 0 {
		return nil
	}
	out := make(map[string][]*podInfo, len(jobs))
	for _, d := range jobs {
		out[d.portName] = nil
	}
	for _, pi := range cc.pods {
		if !pi.eligible {
			continue
		}
		for i, cp := range pi.pod.Ports {
			if _, ok := out[cp.Name]; ok && !portNamed(pi.pod.Ports[:i], cp.Name) {
				out[cp.Name] = append(out[cp.Name], pi)
			}
		}
	}
	return out
}

// updateSets publishes every set the compiled policies use. A set whose inputs did not change
// keeps its published value; one touched by a changed pod is updated from that pod alone; a
// new set, or every set after a namespace change or a burst of pod changes, is computed from
// scratch. It returns how many sets were computed from scratch.
func (cc *Compiler) updateSets(rs *Ruleset, addrDefs map[string]addrSetDef, namedDefs map[string]namedSetDef, changes []podChange, nsChanged bool) int {
	bulk := len(changes) > len(cc.pods)/4+16
	var addrJobs []addrSetDef
	for name, d := range addrDefs {
		if st := cc.addrSets[name]; st == nil || bulk || (nsChanged && d.nsSel != nil) {
			addrJobs = append(addrJobs, d)
		}
	}
	var namedJobs []namedSetDef
	for name, d := range namedDefs {
		if cc.namedSets[name] == nil || bulk {
			namedJobs = append(namedJobs, d)
		}
	}
	freshAddr, freshNamed := cc.setMembers(addrJobs, namedJobs)

	addr := make(map[string]*addrSetState, len(addrDefs))
	for name, d := range addrDefs {
		st := cc.addrSets[name]
		switch fresh, ok := freshAddr[name]; {
		case st == nil:
			st = &addrSetState{def: d, multiset: newMultiset[netip.Addr]()}
			st.build(fresh)
		case ok:
			st.replaceWith(fresh)
		default:
			st.apply(changes, func(pi *podInfo) []netip.Addr {
				if d.matches(pi, cc.nsLabels) {
					return pi.ips()
				}
				return nil
			})
		}
		if st.published == nil || st.dirty() {
			st.publish()
		}
		addr[name] = st
		rs.AddrSets[name] = st.published
	}
	cc.addrSets = addr

	named := make(map[string]*namedSetState, len(namedDefs))
	for name, d := range namedDefs {
		st := cc.namedSets[name]
		switch fresh, ok := freshNamed[name]; {
		case st == nil:
			st = &namedSetState{def: d, multiset: newMultiset[netip.AddrPort]()}
			st.build(fresh)
		case ok:
			st.replaceWith(fresh)
		default:
			st.apply(changes, d.entries)
		}
		if st.published == nil || st.dirty() {
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
	return len(addrJobs) + len(namedJobs)
}

// parallelSets is how many sets to compute from scratch before the work is spread over the
// CPUs: a full compile (a start, a resync after a namespace change) computes hundreds.
const parallelSets = 32

// setMembers computes the members of the given sets from scratch, by set name. Computing a set
// only reads the compiler's indexes of pods and namespaces, which nothing changes meanwhile,
// so many sets are computed by one worker per CPU, each with its own cache of namespace
// selector matches.
func (cc *Compiler) setMembers(addrJobs []addrSetDef, namedJobs []namedSetDef) (map[string][]netip.Addr, map[string][]netip.AddrPort) {
	addr := make([][]netip.Addr, len(addrJobs))
	named := make([][]netip.AddrPort, len(namedJobs))
	byPort := cc.podsByPort(namedJobs)
	work := func(next func() int) {
		nsMatches := map[string][]string{}
		for i := next(); i < len(addrJobs)+len(namedJobs); i = next() {
			if i < len(addrJobs) {
				addr[i] = cc.addrSetMembers(addrJobs[i], nsMatches)
			} else {
				named[i-len(addrJobs)] = cc.namedSetMembers(namedJobs[i-len(addrJobs)], byPort)
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), (len(addrJobs)+len(namedJobs))/parallelSets+1)
	if workers <= 1 {
		i := -1
		work(func() int { i++; return i })
	} else {
		var counter atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() { work(func() int { return int(counter.Add(1)) - 1 }) })
		}
		wg.Wait()
	}
	byAddr := make(map[string][]netip.Addr, len(addrJobs))
	for i, d := range addrJobs {
		byAddr[d.name] = addr[i]
	}
	byNamed := make(map[string][]netip.AddrPort, len(namedJobs))
	for i, d := range namedJobs {
		byNamed[d.name] = named[i]
	}
	return byAddr, byNamed
}
