package policy

import (
	"crypto/sha256"
	"encoding/base32"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
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
}

// Compiler compiles successive snapshots for one node. It is level-triggered: what the result
// judges depends only on the snapshot (only the names of dispatch groups remember earlier
// compiles, see groupNamer). Between compiles it remembers what it derived from each
// object, found by pointer (snapshots share unchanged objects), so a change to one pod costs
// work proportional to the sets that pod can affect, not to the size of the cluster.
type Compiler struct {
	node string
	sels selectorCache

	podPtr   map[string]*corev1.Pod         // every pod of the previous snapshot
	pods     map[string]*podInfo            // its eligible pods
	local    map[string]*podInfo            // its eligible pods on this node
	byNS     map[string]map[string]*podInfo // eligible pods per namespace
	byPort   map[string]map[string]*podInfo // eligible pods per container port name
	nsPtr    map[string]*corev1.Namespace
	nsLabels map[string]labels.Set // including namespaces implied by pods

	// gen is the Generation of the snapshot compiled last, 0 when it was unnumbered; a
	// snapshot whose Changes are relative to gen is compiled from the changed keys alone.
	gen      uint64
	policyNS map[string]map[string]*networkingv1.NetworkPolicy // the snapshot's policies per namespace

	policies  map[*networkingv1.NetworkPolicy]*compiledPolicy
	last      *Ruleset // the previous result, whose sizes the next one is allocated with
	addrSets  map[string]*addrSetState
	namedSets map[string]*namedSetState
	cidrSets  map[string]*CIDRSet

	clusterPolicies map[*npav1beta1.ClusterNetworkPolicy]*compiledClusterPolicy
	nodeSets        map[string]*AddrSet // node peer sets of the previous compile
	// localGen counts changes to the local pods or to namespace labels, which invalidate the
	// cached subjects of ClusterNetworkPolicies. It starts at 1: 0 marks no cached subject.
	localGen uint64

	groupNames map[string]*groupNamer // per dispatch map, see groupNamer

	// np is the NetworkPolicy part of the previous result, which a compile whose only
	// changes are to ClusterNetworkPolicies takes over instead of recomputing.
	np *networkPolicyPart
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
		podPtr:    map[string]*corev1.Pod{},
		pods:      map[string]*podInfo{},
		local:     map[string]*podInfo{},
		byNS:      map[string]map[string]*podInfo{},
		byPort:    map[string]map[string]*podInfo{},
		nsPtr:     map[string]*corev1.Namespace{},
		nsLabels:  map[string]labels.Set{},
		policyNS:  map[string]map[string]*networkingv1.NetworkPolicy{},
		policies:  map[*networkingv1.NetworkPolicy]*compiledPolicy{},
		addrSets:  map[string]*addrSetState{},
		namedSets: map[string]*namedSetState{},
		cidrSets:  map[string]*CIDRSet{},
		localGen:  1,

		groupNames: map[string]*groupNamer{},
	}
}

// localChanged reports whether any change concerns a pod of this node.
func (cc *Compiler) localChanged(changes []podChange) bool {
	for _, c := range changes {
		for _, pi := range [2]*podInfo{c.old, c.new} {
			if pi != nil && pi.pod.Spec.NodeName == cc.node {
				return true
			}
		}
	}
	return false
}

// Compile computes the desired Ruleset for the pods on node with a fresh Compiler.
func Compile(st *cluster.State, node string) (*Ruleset, Stats) {
	return NewCompiler(node).Compile(st)
}

// podChange is a pod whose object differs from the previous snapshot; old or new is nil when
// the pod was not eligible (or did not exist) on that side.
type podChange struct {
	key      string
	old, new *podInfo
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
	var stats Stats
	var changes []podChange
	var nsChanged bool
	// onlyClusterPolicies: nothing a NetworkPolicy verdict depends on changed.
	onlyClusterPolicies := false
	switch ch := st.Changes; {
	case st.Generation != 0 && st.Generation == cc.gen:
		// The same snapshot again (a resync without events): nothing changed.
	case ch != nil && cc.gen != 0 && ch.Since == cc.gen:
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
	}
	reuseNP := onlyClusterPolicies && cc.np != nil
	if !reuseNP {
		// A compile that takes over the NetworkPolicy part uses none of its selectors;
		// rotating would drop them all from the cache.
		cc.sels.rotate()
	}
	cc.gen = st.Generation
	stats.ChangedPods = len(changes)
	if nsChanged || cc.localChanged(changes) {
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
	cc.compileClusterPolicies(st, rs, &stats, addrDefs, namedDefs)
	stats.RecomputedSets = cc.updateSets(rs, addrDefs, namedDefs, changes, nsChanged)
	return rs, stats
}

// compileNetworkPolicies computes the NetworkPolicy part of a Ruleset: dispatch, groups,
// policy chains, ipBlock sets and the peer sets they need. prev is the previous result, whose
// sizes the part's maps are allocated with.
func (cc *Compiler) compileNetworkPolicies(prev *Ruleset) *networkPolicyPart {
	rs := NewRuleset()
	if l := prev; l != nil {
		// Presized like the previous result: a compile then allocates its maps once
		// instead of growing them, which is most of its garbage.
		rs.Dispatch[Ingress] = make(map[netip.Addr]string, len(l.Dispatch[Ingress]))
		rs.Dispatch[Egress] = make(map[netip.Addr]string, len(l.Dispatch[Egress]))
		rs.Groups = make(map[string]Group, len(l.Groups))
		rs.Policies = make(map[string]*PolicyRules, len(l.Policies))
	}
	var stats Stats
	localByNS := map[string][]*podInfo{}
	for _, pi := range cc.local {
		localByNS[pi.pod.Namespace] = append(localByNS[pi.pod.Namespace], pi)
	}
	for _, list := range localByNS {
		sort.Slice(list, func(i, j int) bool { return list[i].key < list[j].key })
		stats.LocalPods += len(list)
	}

	// Only policies in namespaces with local pods can select a local pod.
	nps := make([]*networkingv1.NetworkPolicy, 0, len(cc.policies))
	for ns := range localByNS {
		for _, np := range cc.policyNS[ns] {
			nps = append(nps, np)
		}
	}
	slices.SortFunc(nps, func(a, b *networkingv1.NetworkPolicy) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})

	usedPolicies := make(map[*networkingv1.NetworkPolicy]*compiledPolicy, len(cc.policies))
	addrDefs := make(map[string]addrSetDef, len(cc.addrSets))
	namedDefs := make(map[string]namedSetDef, len(cc.namedSets))
	selecting := map[Direction]map[string][]string{Ingress: make(map[string][]string, len(cc.local)), Egress: make(map[string][]string, len(cc.local))}
	isolated := make(map[string]bool, len(cc.local))
	for _, np := range nps {
		sel := cc.sels.get(&np.Spec.PodSelector).sel
		var selected []*podInfo
		for _, pi := range localByNS[np.Namespace] {
			if sel.Matches(pi.labels) {
				selected = append(selected, pi)
			}
		}
		if len(selected) == 0 {
			continue
		}
		stats.PoliciesSelecting++
		cp := cc.policies[np]
		if cp == nil {
			cp = cc.compilePolicy(np)
		}
		usedPolicies[np] = cp
		for _, dir := range cp.dirs {
			rules := cp.rules[dir]
			chain := PolicyChainName(dir, np.Namespace, np.Name)
			rs.Policies[chain] = rules
			for _, pi := range selected {
				selecting[dir][pi.key] = append(selecting[dir][pi.key], chain)
				isolated[pi.key] = true
			}
		}
		for name, d := range cp.addrSets {
			addrDefs[name] = d
		}
		for name, d := range cp.namedSets {
			namedDefs[name] = d
		}
		for name, s := range cp.cidrSets {
			rs.CIDRSets[name] = s
		}
	}
	cc.policies = usedPolicies
	stats.IsolatedPods = len(isolated)

	for dir, byPod := range selecting {
		for _, chains := range byPod {
			sort.Strings(chains)
		}
		cc.dispatch(cc.groupNamer("np", dir), rs.Dispatch[dir], rs.Groups, dir, byPod, func(chains []string) string {
			return groupName(dir, chains)
		})
	}
	return &networkPolicyPart{dispatch: rs.Dispatch, groups: rs.Groups, policies: rs.Policies, cidrSets: rs.CIDRSets,
		addrDefs: addrDefs, namedDefs: namedDefs, localPods: stats.LocalPods, selecting: stats.PoliciesSelecting, isolated: stats.IsolatedPods}
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
		for _, ip := range cc.local[pk].ips {
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

// diffPods brings the compiler's pod view up to st and returns what changed.
func (cc *Compiler) diffPods(st *cluster.State) []podChange {
	var changes []podChange
	seen := 0
	for key, pod := range st.Pods {
		prev, existed := cc.podPtr[key]
		if existed {
			seen++
			if prev == pod {
				continue
			}
		}
		changes = cc.diffPod(changes, key, pod)
	}
	if seen < len(cc.podPtr) {
		for key := range cc.podPtr {
			if _, ok := st.Pods[key]; !ok {
				changes = cc.diffPod(changes, key, nil)
			}
		}
	}
	// Deterministic order keeps set contents and logs reproducible.
	sort.Slice(changes, func(i, j int) bool { return changes[i].key < changes[j].key })
	return changes
}

// diffPodKeys is diffPods for a snapshot whose changed pod keys (sorted) are known.
func (cc *Compiler) diffPodKeys(st *cluster.State, keys []string) []podChange {
	var changes []podChange
	for _, key := range keys {
		pod := st.Pods[key]
		if prev, existed := cc.podPtr[key]; prev == pod && (existed || pod == nil) {
			continue
		}
		changes = cc.diffPod(changes, key, pod)
	}
	return changes
}

// diffPod records that key now maps to pod (nil: removed) and appends the change.
func (cc *Compiler) diffPod(changes []podChange, key string, pod *corev1.Pod) []podChange {
	if pod == nil {
		delete(cc.podPtr, key)
	} else {
		cc.podPtr[key] = pod
	}
	old := cc.pods[key]
	var cur *podInfo
	if pod != nil {
		if ips := EligibleIPs(pod); len(ips) > 0 {
			cur = &podInfo{pod: pod, key: key, ips: ips, labels: labels.Set(pod.Labels)}
		}
	}
	if old == nil && cur == nil {
		return changes
	}
	cc.setPod(key, old, cur)
	return append(changes, podChange{key: key, old: old, new: cur})
}

// impliedNamespacesChanged reports whether pod changes made a namespace without a Namespace
// object appear or disappear (see diffNamespaces).
func (cc *Compiler) impliedNamespacesChanged(st *cluster.State, changes []podChange) bool {
	for _, c := range changes {
		for _, pi := range [2]*podInfo{c.old, c.new} {
			if pi == nil {
				continue
			}
			ns := pi.pod.Namespace
			if _, ok := st.Namespaces[ns]; ok {
				continue
			}
			_, known := cc.nsLabels[ns]
			_, hasPods := cc.byNS[ns]
			if known != hasPods {
				return true
			}
		}
	}
	return false
}

// indexPolicies rebuilds the per-namespace index of st's policies.
func (cc *Compiler) indexPolicies(st *cluster.State) {
	cc.policyNS = map[string]map[string]*networkingv1.NetworkPolicy{}
	for key, np := range st.Policies {
		m := cc.policyNS[np.Namespace]
		if m == nil {
			m = map[string]*networkingv1.NetworkPolicy{}
			cc.policyNS[np.Namespace] = m
		}
		m[key] = np
	}
}

// updatePolicyKeys brings the per-namespace policy index up to st for the changed keys.
func (cc *Compiler) updatePolicyKeys(st *cluster.State, keys []string) {
	for _, key := range keys {
		ns, _, _ := strings.Cut(key, "/")
		np := st.Policies[key]
		m := cc.policyNS[ns]
		if np == nil {
			if m != nil {
				delete(m, key)
				if len(m) == 0 {
					delete(cc.policyNS, ns)
				}
			}
			continue
		}
		if m == nil {
			m = map[string]*networkingv1.NetworkPolicy{}
			cc.policyNS[ns] = m
		}
		m[key] = np
	}
}

func (cc *Compiler) setPod(key string, old, cur *podInfo) {
	if old != nil {
		delete(cc.pods, key)
		delete(cc.local, key)
		removeFrom(cc.byNS, old.pod.Namespace, key)
		for _, name := range portNames(old.pod) {
			removeFrom(cc.byPort, name, key)
		}
	}
	if cur != nil {
		cc.pods[key] = cur
		if cur.pod.Spec.NodeName == cc.node {
			cc.local[key] = cur
		}
		addTo(cc.byNS, cur.pod.Namespace, key, cur)
		for _, name := range portNames(cur.pod) {
			addTo(cc.byPort, name, key, cur)
		}
	}
}

func addTo(index map[string]map[string]*podInfo, group, key string, pi *podInfo) {
	m := index[group]
	if m == nil {
		m = map[string]*podInfo{}
		index[group] = m
	}
	m[key] = pi
}

func removeFrom(index map[string]map[string]*podInfo, group, key string) {
	if m := index[group]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(index, group)
		}
	}
}

func portNames(pod *corev1.Pod) []string {
	var names []string
	for _, ctr := range pod.Spec.Containers {
		for _, cp := range ctr.Ports {
			if cp.Name != "" {
				names = append(names, cp.Name)
			}
		}
	}
	return names
}

// diffNamespaces refreshes namespace labels and reports whether any namespace appeared,
// disappeared or changed, including namespaces implied by pods alone.
func (cc *Compiler) diffNamespaces(st *cluster.State) bool {
	changed := len(st.Namespaces) != len(cc.nsPtr)
	if !changed {
		for name, ns := range st.Namespaces {
			if cc.nsPtr[name] != ns {
				changed = true
				break
			}
		}
	}
	implied := 0
	for ns := range cc.byNS {
		if _, ok := st.Namespaces[ns]; !ok {
			implied++
			if _, known := cc.nsLabels[ns]; !known {
				changed = true
			}
		}
	}
	if !changed && len(cc.nsLabels) == len(st.Namespaces)+implied {
		return false
	}
	cc.nsPtr = make(map[string]*corev1.Namespace, len(st.Namespaces))
	cc.nsLabels = make(map[string]labels.Set, len(st.Namespaces)+implied)
	for name, ns := range st.Namespaces {
		cc.nsPtr[name] = ns
		cc.nsLabels[name] = labels.Set(ns.Labels)
	}
	for ns := range cc.byNS {
		if _, ok := cc.nsLabels[ns]; !ok {
			// A pod proves its namespace exists even when the Namespace object is not (yet)
			// known, e.g. a manifests directory that declares no namespaces.
			cc.nsLabels[ns] = labels.Set{cluster.NamespaceNameLabel: ns}
		}
	}
	return true
}

// EligibleIPs returns the IPs of a pod that takes part in policy, or nil: pods without IPs, on
// the host network, or finished are neither targets nor peers.
func EligibleIPs(pod *corev1.Pod) []netip.Addr {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var ips []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		ips = append(ips, a.Unmap())
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	return ips
}

// compiledPolicy is what one NetworkPolicy object compiles to, independent of other objects:
// its rules per direction and the definitions of the sets they name.
type compiledPolicy struct {
	dirs      []Direction
	rules     map[Direction]*PolicyRules
	addrSets  map[string]addrSetDef
	namedSets map[string]namedSetDef
	cidrSets  map[string]*CIDRSet
}

func (cc *Compiler) compilePolicy(np *networkingv1.NetworkPolicy) *compiledPolicy {
	cp := &compiledPolicy{
		rules:     map[Direction]*PolicyRules{},
		addrSets:  map[string]addrSetDef{},
		namedSets: map[string]namedSetDef{},
		cidrSets:  map[string]*CIDRSet{},
	}
	source := cluster.Key(np.Namespace, np.Name)
	for _, pt := range np.Spec.PolicyTypes {
		pr := &PolicyRules{Source: source}
		if pt == networkingv1.PolicyTypeEgress {
			pr.Direction = Egress
			for _, r := range np.Spec.Egress {
				pr.Rules = append(pr.Rules, cc.compileRule(cp, np.Namespace, r.To, r.Ports))
			}
		} else {
			pr.Direction = Ingress
			for _, r := range np.Spec.Ingress {
				pr.Rules = append(pr.Rules, cc.compileRule(cp, np.Namespace, r.From, r.Ports))
			}
		}
		cp.dirs = append(cp.dirs, pr.Direction)
		cp.rules[pr.Direction] = pr
	}
	return cp
}

func (cc *Compiler) compileRule(cp *compiledPolicy, policyNS string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) Rule {
	var rule Rule
	for _, peer := range peers {
		if peer.IPBlock != nil {
			name, set := cc.cidrSet(peer.IPBlock)
			cp.cidrSets[name] = set
			rule.Peers = append(rule.Peers, Peer{CIDRSet: name, IPv6: set.IPv6})
			continue
		}
		d := cc.addrSetDef(policyNS, peer.NamespaceSelector, peer.PodSelector)
		cp.addrSets[d.name] = d
		rule.Peers = append(rule.Peers, Peer{AddrSet: d.name})
	}
	rule.Ports = compilePorts(cp, ports)
	return rule
}

func compilePorts(cp *compiledPolicy, ports []networkingv1.NetworkPolicyPort) []PortMatch {
	if len(ports) == 0 {
		return nil
	}
	anyPort := map[Protocol]bool{}
	ranges := map[Protocol][]PortRange{}
	var named []PortMatch
	for _, p := range ports {
		proto := TCP
		if p.Protocol != nil {
			proto = Protocol(strings.ToLower(string(*p.Protocol)))
		}
		switch {
		case p.Port == nil:
			anyPort[proto] = true
		case p.Port.Type == intstr.String:
			d := namedSetDef{name: "port-" + p.Port.StrVal + "-" + string(proto), portName: p.Port.StrVal,
				proto: corev1.Protocol(strings.ToUpper(string(proto)))}
			cp.namedSets[d.name] = d
			if !slices.ContainsFunc(named, func(x PortMatch) bool { return x.NamedPortSet == d.name }) {
				named = append(named, PortMatch{Protocol: proto, NamedPortSet: d.name})
			}
		default:
			first := uint16(p.Port.IntVal)
			last := first
			if p.EndPort != nil {
				last = uint16(*p.EndPort)
			}
			ranges[proto] = append(ranges[proto], PortRange{first, last})
		}
	}
	var out []PortMatch
	for _, proto := range []Protocol{TCP, UDP, SCTP} {
		switch {
		case anyPort[proto]:
			out = append(out, PortMatch{Protocol: proto})
		case len(ranges[proto]) > 0:
			out = append(out, PortMatch{Protocol: proto, Ranges: mergeRanges(ranges[proto])})
		}
	}
	for _, n := range named {
		if !anyPort[n.Protocol] {
			out = append(out, n)
		}
	}
	return out
}

// mergeRanges sorts and coalesces overlapping or adjacent ranges, because nftables rejects
// overlapping elements in an anonymous interval set.
func mergeRanges(in []PortRange) []PortRange {
	sort.Slice(in, func(i, j int) bool { return in[i].First < in[j].First })
	out := []PortRange{in[0]}
	for _, r := range in[1:] {
		last := &out[len(out)-1]
		if uint32(r.First) <= uint32(last.Last)+1 {
			if r.Last > last.Last {
				last.Last = r.Last
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func (cc *Compiler) cidrSet(b *networkingv1.IPBlock) (string, *CIDRSet) {
	cidr, _ := netip.ParsePrefix(b.CIDR) // validated by the source
	cidr = cidr.Masked()
	var except []netip.Prefix
	for _, e := range b.Except {
		if p, err := netip.ParsePrefix(e); err == nil {
			except = append(except, p.Masked())
		}
	}
	slices.SortFunc(except, netip.Prefix.Compare)
	key := cidr.String()
	for _, e := range except {
		key += "," + e.String()
	}
	name := "cidr-" + shortHash(key)
	if s, ok := cc.cidrSets[name]; ok {
		return name, s
	}
	s := &CIDRSet{IPv6: cidr.Addr().Is6(), Prefixes: SubtractPrefixes(cidr, except)}
	cc.cidrSets[name] = s
	return name, s
}

// SubtractPrefixes returns disjoint prefixes covering cidr minus every except prefix, in
// address order. Each half of a split is walked with only the excepts inside it, so the work
// is the number of excepts times the prefix length, not its square: an ipBlock may hold
// thousands of excepts.
func SubtractPrefixes(cidr netip.Prefix, except []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	var walk func(p netip.Prefix, except []netip.Prefix)
	walk = func(p netip.Prefix, except []netip.Prefix) {
		var inside []netip.Prefix
		for _, e := range except {
			if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
				return // fully excluded
			}
			if p.Contains(e.Addr()) {
				inside = append(inside, e)
			}
		}
		if len(inside) == 0 {
			out = append(out, p)
			return
		}
		lo, hi := splitPrefix(p)
		walk(lo, inside)
		walk(hi, inside)
	}
	walk(cidr, except)
	return out
}

func splitPrefix(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	lo := netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	idx := p.Bits() / 8
	b[idx] |= 0x80 >> (p.Bits() % 8)
	hiAddr, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(hiAddr, bits)
}

// PolicyChainName names the chain holding one policy's rules for one direction. It stays
// readable in `nft list` output; very long names are cut and made unique with a hash. The
// separator "_" never occurs in a Kubernetes name, and nft's parser takes it in a chain name
// (it refuses "~"); the kernel takes names of up to 255 bytes.
func PolicyChainName(dir Direction, namespace, name string) string {
	prefix := "in/"
	if dir == Egress {
		prefix = "out/"
	}
	n := prefix + namespace + "/" + name
	if len(n) > 200 {
		n = n[:180] + "_" + shortHash(n)
	}
	return n
}

func groupName(dir Direction, chains []string) string {
	return "grp-" + string(dir) + "-" + shortHash(strings.Join(chains, "\n"))
}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:8])[:12]
}

func intOrString(n int32) *intstr.IntOrString {
	v := intstr.FromInt32(n)
	return &v
}

func namedPort(name string) *intstr.IntOrString {
	v := intstr.FromString(name)
	return &v
}

func labelsOf(m map[string]string) labels.Set { return labels.Set(m) }
