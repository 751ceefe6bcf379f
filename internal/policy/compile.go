package policy

import (
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Stats describes a compilation, for logs and metrics.
type Stats struct {
	LocalPods         int // eligible pods on this node
	IsolatedPods      int // local pods selected by at least one policy
	PoliciesSelecting int // policies that select at least one local pod
	ChangedPods       int // pods added, changed or removed since the previous compile
	RecomputedSets    int // peer sets computed from scratch rather than updated by delta

	ClusterPoliciesSelecting int // ClusterNetworkPolicies that select at least one local pod
	// Staged counts the policies left out because they are staged (see StagedAnnotation).
	Staged int
}

// Compiler compiles successive snapshots for one node. It is level-triggered: what the result
// judges depends only on the snapshot (only the names of dispatch groups remember earlier
// compiles, see groupNamer). Between compiles it remembers what it derived from each
// object, found by pointer (snapshots share unchanged objects), so a change to one pod costs
// work proportional to the sets that pod can affect, not to the size of the cluster.
type Compiler struct {
	node string
	sels selectorCache
	// staged are the staged policies, left out unless asWritten (see StagedAnnotation).
	staged    stagedKeys
	asWritten bool
	// written compiles the snapshots as written while they have staged policies, for the
	// judgement of what those would change (Ruleset.Staged).
	written *Compiler

	pods     map[string]*podInfo            // every pod of the previous snapshot
	local    map[string]*podInfo            // its eligible pods on this node
	byNS     map[string]map[string]*podInfo // its eligible pods per namespace
	nsPtr    map[string]*corev1.Namespace
	nsLabels map[string]labels.Set // including namespaces implied by pods

	// gen is the Generation of the snapshot compiled last, 0 when it was unnumbered; a
	// snapshot whose Changes are relative to gen is compiled from the changed keys alone.
	gen      uint64
	policyNS map[string]map[string]*networkingv1.NetworkPolicy // the snapshot's policies per namespace

	// nsParts holds what each namespace with local pods contributed to the last NetworkPolicy
	// part; nsDirty names those whose policies or local pods changed since (allNSDirty: any
	// may have). A recomputed part still takes over the policies its previous one compiled.
	nsParts    map[string]*nsPart
	nsDirty    map[string]bool
	allNSDirty bool
	last       *Ruleset // the previous result, whose sizes the next one is allocated with
	addrSets   map[string]*addrSetState
	namedSets  map[string]*namedSetState
	cidrSets   map[string]*CIDRSet

	clusterPolicies map[*npav1beta1.ClusterNetworkPolicy]*compiledClusterPolicy
	nodeSets        map[string]*AddrSet // node peer sets of the previous compile
	clusterPart     *clusterPart        // what the ClusterNetworkPolicies contributed to it
	// localGen counts changes to the local pods or to namespace labels, which invalidate the
	// cached subjects of ClusterNetworkPolicies and their clusterPart. It starts at 1: 0 marks
	// no cached subject.
	localGen uint64

	groupNames map[string]*groupNamer // per dispatch map, see groupNamer

	// np is the NetworkPolicy part of the previous result, which a compile whose only
	// changes are to ClusterNetworkPolicies takes over instead of recomputing.
	np *networkPolicyPart
	// merged is the union of nsParts, which np's maps come from.
	merged *npMerge
}

// networkPolicyPart is what the NetworkPolicies of a snapshot contribute to a Ruleset. Its
// maps are shared with the Rulesets it went into, which nothing writes after Compile.
type networkPolicyPart struct {
	dispatch            map[Direction]map[netip.Addr]string
	groups              map[string]Group
	policies            map[string]*PolicyRules
	cidrSets            map[string]*CIDRSet
	addrDefs            map[string]addrSetDef
	namedDefs           map[string]namedSetDef
	localPods           int
	selecting, isolated int
}

// NewCompiler returns a Compiler for node.
func NewCompiler(node string) *Compiler {
	return &Compiler{
		node:      node,
		sels:      selectorCache{cur: map[*metav1.LabelSelector]parsedSelector{}},
		pods:      map[string]*podInfo{},
		local:     map[string]*podInfo{},
		byNS:      map[string]map[string]*podInfo{},
		nsPtr:     map[string]*corev1.Namespace{},
		nsLabels:  map[string]labels.Set{},
		policyNS:  map[string]map[string]*networkingv1.NetworkPolicy{},
		addrSets:  map[string]*addrSetState{},
		namedSets: map[string]*namedSetState{},
		cidrSets:  map[string]*CIDRSet{},
		nsDirty:   map[string]bool{},
		localGen:  1,

		groupNames: map[string]*groupNamer{},
	}
}

// markLocalChanges marks the namespaces of the changes that concern a pod of this node dirty,
// and reports whether there was any.
func (cc *Compiler) markLocalChanges(changes []podChange) bool {
	found := false
	for _, c := range changes {
		for _, pi := range [2]*podInfo{c.old, c.new} {
			if pi != nil && pi.pod.NodeName == cc.node {
				cc.markNamespaceDirty(pi.pod.Namespace)
				found = true
			}
		}
	}
	return found
}

// Compile computes the desired Ruleset for the pods on node with a fresh Compiler.
func Compile(st *cluster.State, node string) (*Ruleset, Stats) {
	return NewCompiler(node).Compile(st)
}

// Unchanged reports whether st holds the same objects as the snapshot compiled last, and if so
// takes st as compiled, so that the next snapshot's Changes still apply: the last Ruleset
// stands for st too. Sources make such snapshots when only their Revision moved (an update of
// fields the agent drops, a file rewritten with equal objects).
func (cc *Compiler) Unchanged(st *cluster.State) bool {
	if st.Generation != 0 && st.Generation == cc.gen {
		return true
	}
	ch := st.Changes
	if ch == nil || cc.gen == 0 || ch.Since != cc.gen ||
		len(ch.Namespaces)+len(ch.Pods)+len(ch.Policies)+len(ch.Nodes)+len(ch.ClusterPolicies) > 0 {
		return false
	}
	cc.gen = st.Generation
	return true
}

// Compile computes the desired Ruleset for the compiler's node from st.
func (cc *Compiler) Compile(st *cluster.State) (*Ruleset, Stats) {
	if cc.asWritten {
		return cc.compile(st)
	}
	asWritten := st
	st = cc.staged.enforced(st, st.Changes != nil && cc.gen != 0 && st.Changes.Since == cc.gen)
	rs, stats := cc.compile(st)
	stats.Staged = len(cc.staged.np) + len(cc.staged.cnp)
	if stats.Staged == 0 {
		cc.written = nil
		return rs, stats
	}
	if cc.written == nil {
		cc.written = NewCompiler(cc.node)
		cc.written.asWritten = true
	}
	written, _ := cc.written.Compile(asWritten)
	return withStaged(rs, written), stats
}

func (cc *Compiler) compile(st *cluster.State) (*Ruleset, Stats) {
	var stats Stats
	var changes []podChange
	var nsChanged bool
	// onlyClusterPolicies: nothing a NetworkPolicy verdict depends on changed.
	onlyClusterPolicies := false
	// clusterInputsChanged: ClusterNetworkPolicies or nodes may have changed.
	clusterInputsChanged := true
	switch ch := st.Changes; {
	case st.Generation != 0 && st.Generation == cc.gen:
		// The same snapshot again (a resync without events): nothing changed.
		clusterInputsChanged = false
	case ch != nil && cc.gen != 0 && ch.Since == cc.gen:
		clusterInputsChanged = len(ch.ClusterPolicies) > 0 || len(ch.Nodes) > 0
		changes = cc.diffPodKeys(st, ch.Pods)
		if len(ch.Namespaces) > 0 || cc.impliedNamespacesChanged(st, changes) {
			nsChanged = cc.diffNamespaces(st)
		}
		cc.updatePolicyKeys(st, ch.Policies)
		onlyClusterPolicies = len(changes) == 0 && !nsChanged && len(ch.Policies) == 0 && len(ch.Nodes) == 0
	default:
		changes = cc.diffPods(st)
		nsChanged = cc.diffNamespaces(st)
		cc.indexPolicies(st)
		cc.allNSDirty = true // any policy may have changed
	}
	localChanged := cc.markLocalChanges(changes)
	reuseNP := onlyClusterPolicies && cc.np != nil
	if !reuseNP {
		// A compile that takes over the NetworkPolicy part uses none of its selectors;
		// rotating would drop them all from the cache.
		cc.sels.rotate()
	}
	cc.gen = st.Generation
	stats.ChangedPods = len(changes)
	if nsChanged || localChanged {
		cc.localGen++
	}

	rs := NewRuleset()
	if l := cc.last; l != nil {
		// Presized like the previous result: a compile then allocates its maps once
		// instead of growing them, which is most of its garbage.
		rs.AddrSets = make(map[string]*AddrSet, len(l.AddrSets))
		rs.CIDRSets = make(map[string]*CIDRSet, len(l.CIDRSets))
		rs.NamedPortSets = make(map[string]*NamedPortSet, len(l.NamedPortSets))
	}
	if !reuseNP {
		cc.np = cc.compileNetworkPolicies(cc.last)
	}
	cc.last = rs
	np := cc.np
	rs.Dispatch, rs.Groups, rs.Policies = np.dispatch, np.groups, np.policies
	maps.Copy(rs.CIDRSets, np.cidrSets)
	stats.LocalPods, stats.PoliciesSelecting, stats.IsolatedPods = np.localPods, np.selecting, np.isolated
	// The ClusterNetworkPolicies add their sets to copies: the part keeps only its own.
	addrDefs, namedDefs := np.addrDefs, np.namedDefs
	if len(st.ClusterPolicies) > 0 {
		addrDefs, namedDefs = maps.Clone(addrDefs), maps.Clone(namedDefs)
	}
	cc.compileClusterPolicies(st, rs, &stats, addrDefs, namedDefs, clusterInputsChanged)
	stats.RecomputedSets = cc.updateSets(rs, addrDefs, namedDefs, changes, nsChanged)
	return rs, stats
}

// compileNetworkPolicies computes the NetworkPolicy part of a Ruleset: dispatch, groups,
// policy chains, ipBlock sets and the peer sets they need. prev is the previous result, whose
// sizes the part's maps are allocated with. Only policies in namespaces with local pods can
// select a local pod, and what a namespace's policies contribute depends on nothing outside
// it: namespaces in which no policy and no local pod changed keep their nsPart.
func (cc *Compiler) compileNetworkPolicies(prev *Ruleset) *networkPolicyPart {
	rs := NewRuleset()
	if l := prev; l != nil {
		// Presized like the previous result: a compile then allocates its maps once
		// instead of growing them, which is most of its garbage.
		rs.Dispatch[Ingress] = make(map[netip.Addr]string, len(l.Dispatch[Ingress]))
		rs.Dispatch[Egress] = make(map[netip.Addr]string, len(l.Dispatch[Egress]))
		rs.Groups = make(map[string]Group, len(l.Groups))
	}
	localByNS := map[string][]*podInfo{}
	for _, pi := range cc.local {
		localByNS[pi.pod.Namespace] = append(localByNS[pi.pod.Namespace], pi)
	}
	parts := make(map[string]*nsPart, len(localByNS))
	var changed []string // namespaces whose part is new, recomputed or gone
	for ns, local := range localByNS {
		part := cc.nsParts[ns]
		if part == nil || cc.allNSDirty || cc.nsDirty[ns] {
			part = cc.compileNamespacePolicies(ns, local, part)
			changed = append(changed, ns)
		}
		parts[ns] = part
	}
	for ns := range cc.nsParts {
		if parts[ns] == nil {
			changed = append(changed, ns)
		}
	}
	prevParts := cc.nsParts
	cc.nsParts = parts
	clear(cc.nsDirty)
	cc.allNSDirty = false

	// A few namespaces changed: the union is updated by their difference. That costs a copy
	// of its maps (a copy of their tables, several times faster than inserting their keys)
	// and what the changed namespaces hold, not an insert of what every namespace holds.
	if m := cc.merged; m != nil && 4*len(changed) <= len(parts) {
		m.policies = maps.Clone(m.policies)
		m.addrDefs.fork()
		m.namedDefs.fork()
		m.cidrSets.fork()
		for _, ns := range changed {
			if old := prevParts[ns]; old != nil {
				m.remove(old)
			}
		}
		for _, ns := range changed {
			if part := parts[ns]; part != nil {
				m.add(part)
			}
		}
	} else {
		cc.merged = newNPMerge(prev, len(cc.local))
		for _, part := range parts {
			cc.merged.add(part)
		}
	}
	m := cc.merged
	rs.Policies, rs.CIDRSets = m.policies, m.cidrSets.vals
	np := &networkPolicyPart{dispatch: rs.Dispatch, groups: rs.Groups, policies: rs.Policies, cidrSets: rs.CIDRSets, localPods: len(cc.local),
		addrDefs: m.addrDefs.vals, namedDefs: m.namedDefs.vals}
	for _, part := range parts {
		np.selecting += len(part.compiled)
		np.isolated += part.isolated
	}
	for _, dir := range []Direction{Ingress, Egress} {
		cc.dispatch(cc.groupNamer("np", dir), rs.Dispatch[dir], rs.Groups, dir, m.selecting[dir], func(chains []string) string {
			return groupName(dir, chains)
		})
	}
	return np
}

// npMerge is the union of the nsParts of a compile, kept for the next one. Its maps of
// policies and sets go into Rulesets, which nothing changes after Compile: an update writes
// copies of them. selecting (local pod key -> the chains judging it) is the compiler's own.
type npMerge struct {
	policies  map[string]*PolicyRules
	addrDefs  counted[addrSetDef]
	namedDefs counted[namedSetDef]
	cidrSets  counted[*CIDRSet]
	selecting map[Direction]map[string][]string
}

// newNPMerge returns an empty union, sized like the previous result (prev, nil if none) and
// the node's local pods: allocated once at the size it will have instead of grown, most of a
// full merge's garbage otherwise.
func newNPMerge(prev *Ruleset, localPods int) *npMerge {
	var policies, addrSets, cidrSets int
	if prev != nil {
		policies, addrSets, cidrSets = len(prev.Policies), len(prev.AddrSets), len(prev.CIDRSets)
	}
	return &npMerge{policies: make(map[string]*PolicyRules, policies),
		addrDefs: newCounted[addrSetDef](addrSets), namedDefs: newCounted[namedSetDef](0), cidrSets: newCounted[*CIDRSet](cidrSets),
		selecting: map[Direction]map[string][]string{Ingress: make(map[string][]string, localPods), Egress: make(map[string][]string, localPods)}}
}

// add puts what part contributes into the union.
func (m *npMerge) add(part *nsPart) {
	maps.Copy(m.policies, part.chains)
	for dir, byPod := range part.selecting {
		maps.Copy(m.selecting[dir], byPod)
	}
	for _, cp := range part.compiled {
		m.addrDefs.add(cp.addrSets)
		m.namedDefs.add(cp.namedSets)
		m.cidrSets.add(cp.cidrSets)
	}
}

// remove takes what part contributed out of the union: its chains and pods (no other
// namespace's part names them) and the sets no other compiled policy uses.
func (m *npMerge) remove(part *nsPart) {
	for chain := range part.chains {
		delete(m.policies, chain)
	}
	for dir, byPod := range part.selecting {
		for pod := range byPod {
			delete(m.selecting[dir], pod)
		}
	}
	for _, cp := range part.compiled {
		m.addrDefs.remove(cp.addrSets)
		m.namedDefs.remove(cp.namedSets)
		m.cidrSets.remove(cp.cidrSets)
	}
}

// counted is a union of named sets, each kept while a compiled policy uses it. Sets are named
// by their content, so every use of a name is the same set.
type counted[V any] struct {
	vals map[string]V // goes into Rulesets: written only after fork
	refs map[string]int
}

func newCounted[V any](size int) counted[V] {
	return counted[V]{vals: make(map[string]V, size), refs: make(map[string]int, size)}
}

// fork gives the union a copy of vals of its own to change, the Rulesets keeping the old.
func (c *counted[V]) fork() { c.vals = maps.Clone(c.vals) }

func (c *counted[V]) add(sets map[string]V) {
	for name, v := range sets {
		c.vals[name] = v
		c.refs[name]++
	}
}

func (c *counted[V]) remove(sets map[string]V) {
	for name := range sets {
		if c.refs[name]--; c.refs[name] == 0 {
			delete(c.refs, name)
			delete(c.vals, name)
		}
	}
}

// nsPart is what the NetworkPolicies of one namespace contribute to the NetworkPolicy part,
// given the namespace's local pods.
type nsPart struct {
	compiled  map[*networkingv1.NetworkPolicy]*compiledPolicy // the policies selecting a local pod
	chains    map[string]*PolicyRules                         // their chains
	selecting map[Direction]map[string][]string               // local pod key -> chains judging it, sorted
	isolated  int                                             // local pods selected by some policy
}

// markNamespaceDirty makes the next compile recompute the nsPart of ns.
func (cc *Compiler) markNamespaceDirty(ns string) { cc.nsDirty[ns] = true }

// compileNamespacePolicies computes the nsPart of ns, whose local pods are local. Policies
// that prev compiled are taken over (compiled policies are found by pointer: a changed
// policy is a new object).
func (cc *Compiler) compileNamespacePolicies(ns string, local []*podInfo, prev *nsPart) *nsPart {
	sort.Slice(local, func(i, j int) bool { return local[i].key < local[j].key })
	nps := slices.SortedFunc(maps.Values(cc.policyNS[ns]), func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Name, b.Name)
	})
	part := &nsPart{compiled: map[*networkingv1.NetworkPolicy]*compiledPolicy{}, chains: map[string]*PolicyRules{},
		selecting: map[Direction]map[string][]string{Ingress: {}, Egress: {}}}
	isolated := map[string]bool{}
	var selected []*podInfo
	for _, np := range nps {
		sel := cc.sels.get(&np.Spec.PodSelector).sel
		selected = selected[:0]
		for _, pi := range local {
			if sel.Matches(pi.labels()) {
				selected = append(selected, pi)
			}
		}
		if len(selected) == 0 {
			continue
		}
		var cp *compiledPolicy
		if prev != nil {
			cp = prev.compiled[np]
		}
		if cp == nil {
			cp = cc.compilePolicy(np)
		}
		part.compiled[np] = cp
		for _, dir := range cp.dirs {
			chain := PolicyChainName(dir, np.Namespace, np.Name)
			part.chains[chain] = cp.rules[dir]
			for _, pi := range selected {
				part.selecting[dir][pi.key] = append(part.selecting[dir][pi.key], chain)
				isolated[pi.key] = true
			}
		}
	}
	for _, byPod := range part.selecting {
		for _, chains := range byPod {
			sort.Strings(chains)
		}
	}
	part.isolated = len(isolated)
	return part
}

// dispatch maps the IPs of each local pod in byPod (pod key -> the chains judging it, in
// judging order) to the group of those chains, which it names (see groupNamer) and defines.
func (cc *Compiler) dispatch(namer *groupNamer, into map[netip.Addr]string, groups map[string]Group, dir Direction,
	byPod map[string][]string, fresh func(chains []string) string) {
	ofPod, chainsOf := namer.assign(byPod, fresh)
	for name, chains := range chainsOf {
		groups[name] = Group{Direction: dir, Policies: chains}
	}
	owner := make(map[netip.Addr]bool, len(byPod))
	pods := make([]string, 0, len(byPod))
	for pk := range byPod {
		pods = append(pods, pk)
	}
	sort.Strings(pods)
	for _, pk := range pods {
		for _, ip := range cc.local[pk].ips() {
			// Two live pods claiming one IP is a transient state (IP reuse); the pod
			// key order makes the winner deterministic until the stale pod goes away.
			if owner[ip] {
				continue
			}
			owner[ip] = true
			into[ip] = ofPod[pk]
		}
	}
}

// groupNamer returns the namer of one dispatch map: "np" or a tier, and a direction.
func (cc *Compiler) groupNamer(of string, dir Direction) *groupNamer {
	key := of + "/" + string(dir)
	gn := cc.groupNames[key]
	if gn == nil {
		gn = &groupNamer{}
		cc.groupNames[key] = gn
	}
	return gn
}
