package policy_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/sortedset"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// TestIncrementalCompileEqualsFresh drives one Compiler through random changes and checks
// after each that its result equals a fresh compile of the same snapshot: the incremental
// shortcuts must never change the answer. It runs with unnumbered snapshots, which the
// compiler diffs by walking them, and with numbered ones that list their changed keys, as
// the sources hand out.
func TestIncrementalCompileEqualsFresh(t *testing.T) {
	for _, numbered := range []bool{false, true} {
		t.Run(fmt.Sprintf("numbered=%v", numbered), func(t *testing.T) { testIncrementalCompile(t, numbered) })
	}
}

func testIncrementalCompile(t *testing.T, numbered bool) {
	spec := synth.Spec{Namespaces: 12, Pods: 80, LocalPods: 15, Policies: 60, ClusterPolicies: 20, LocalNode: "node-0", Nodes: 3, DualStack: true,
		LocalCIDRv4: synth.Default().LocalCIDRv4, RemoteCIDRv4: synth.Default().RemoteCIDRv4}
	st := synth.Generate(spec)
	r := rand.New(rand.NewPCG(1, 2))
	// Peers chosen by namespace name, so that namespaces implied by their pods alone matter.
	byName := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-00000", Name: "from-implied"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: cluster.NamespaceNameLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"implied-0", "implied-1", "ns-00001"}}}}}}}}}}
	cluster.DefaultNetworkPolicy(byName)
	st.Policies[cluster.Key(byName.Namespace, byName.Name)] = byName
	if numbered {
		cluster.NumberAfter(st, nil)
	}
	c := policy.NewCompiler(spec.LocalNode)
	for step := 0; step < 300; step++ {
		next := st.Clone()
		keys := podKeys(next)
		what := ""
		switch r.IntN(16) {
		case 0: // relabel a pod
			k := keys[r.IntN(len(keys))]
			p := clonePod(next.Pods.Get(k))
			p.Labels["app"] = fmt.Sprintf("app-%d", r.IntN(10))
			p.Labels["tier"] = []string{"web", "api", "db"}[r.IntN(3)]
			next.Pods.Set(k, p)
			what = "relabel " + k
		case 1: // delete a pod
			k := keys[r.IntN(len(keys))]
			next.Pods.Set(k, nil)
			what = "delete " + k
		case 2: // add a pod, sometimes local, sometimes reusing an IP
			src := clonePod(next.Pods.Get(keys[r.IntN(len(keys))]))
			src.Name = fmt.Sprintf("new-%d", step)
			if r.IntN(2) == 0 {
				src.NodeName = spec.LocalNode
			}
			next.Pods.Set(cluster.Key(src.Namespace, src.Name), src)
			what = "add " + src.Name
		case 3: // relabel a namespace
			name := fmt.Sprintf("ns-%05d", r.IntN(spec.Namespaces))
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{cluster.NamespaceNameLabel: name}}}
			if old := next.Namespaces[name]; old != nil {
				ns = old.DeepCopy()
			}
			ns.Labels["team"] = fmt.Sprintf("team-%d", r.IntN(40))
			next.Namespaces[ns.Name] = ns
			what = "relabel ns " + ns.Name
		case 4: // finish a pod
			k := keys[r.IntN(len(keys))]
			p := clonePod(next.Pods.Get(k))
			p.Phase = corev1.PodSucceeded
			next.Pods.Set(k, p)
			what = "finish " + k
		case 5: // delete a policy
			for k := range next.Policies {
				delete(next.Policies, k)
				what = "delete policy " + k
				break
			}
		case 6: // change a pod's named port number
			k := keys[r.IntN(len(keys))]
			p := clonePod(next.Pods.Get(k))
			p.Ports[1].Port = int32(9000 + r.IntN(5))
			next.Pods.Set(k, p)
			what = "port " + k
		case 7: // add a policy: a copy of one with another name and selector
			for _, np := range next.Policies {
				np = np.DeepCopy()
				np.Name = fmt.Sprintf("new-%d", step)
				np.Spec.PodSelector.MatchLabels = map[string]string{"app": fmt.Sprintf("app-%d", r.IntN(10))}
				next.Policies[cluster.Key(np.Namespace, np.Name)] = np
				what = "add policy " + np.Name
				break
			}
		case 8: // delete a Namespace object; its pods keep it implied
			ns := fmt.Sprintf("ns-%05d", r.IntN(spec.Namespaces))
			delete(next.Namespaces, ns)
			what = "delete ns " + ns
		case 9: // add a pod in a namespace no object declares
			src := clonePod(next.Pods.Get(keys[r.IntN(len(keys))]))
			src.Namespace = fmt.Sprintf("implied-%d", r.IntN(3))
			src.Name = fmt.Sprintf("new-%d", step)
			if r.IntN(2) == 0 {
				src.NodeName = spec.LocalNode
			}
			next.Pods.Set(cluster.Key(src.Namespace, src.Name), src)
			what = "add implied " + src.Namespace + "/" + src.Name
		case 10: // add a ClusterNetworkPolicy: only the tiers change
			cnp := synth.ClusterPolicy(r.IntN(200))
			cnp.Name = fmt.Sprintf("new-%d", step)
			next.ClusterPolicies[cnp.Name] = cnp
			what = "add cnp " + cnp.Name
		case 11: // delete a ClusterNetworkPolicy
			for k := range next.ClusterPolicies {
				delete(next.ClusterPolicies, k)
				what = "delete cnp " + k
				break
			}
		case 12: // move a ClusterNetworkPolicy in its tier
			for k, cnp := range next.ClusterPolicies {
				cnp = cnp.DeepCopy()
				cnp.Spec.Priority = int32(r.IntN(1001))
				next.ClusterPolicies[k] = cnp
				what = "reprioritize cnp " + k
				break
			}
		case 14: // add a ClusterNetworkPolicy admitting the nodes of a zone
			cnp := synth.ClusterPolicy(r.IntN(200))
			cnp.Name = fmt.Sprintf("to-nodes-%d", step)
			cnp.Spec.Egress = append(cnp.Spec.Egress, npav1beta1.ClusterNetworkPolicyEgressRule{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
				To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}}}})
			next.ClusterPolicies[cnp.Name] = cnp
			what = "add cnp to nodes " + cnp.Name
		case 15: // move a node into or out of that zone, with a new address
			name := fmt.Sprintf("node-%d", r.IntN(spec.Nodes))
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if old := next.Nodes[name]; old != nil {
				node = old.DeepCopy()
			}
			node.Labels = map[string]string{"zone": []string{"a", "b"}[r.IntN(2)]}
			node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.0.2.%d", r.IntN(250))}}
			next.Nodes[name] = node
			what = "move node " + name
		case 13: // change a policy in place: whom it selects and whom it admits
			for k, np := range next.Policies {
				np = np.DeepCopy()
				np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"tier": []string{"web", "api", "db"}[r.IntN(3)]}}
				np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", r.IntN(10))}}}}}}
				next.Policies[k] = np
				what = "change policy " + k
				break
			}
		}
		if numbered {
			cluster.NumberAfter(next, st)
		}
		st = next
		got, _ := c.Compile(st)
		if numbered && r.IntN(4) == 0 {
			got, _ = c.Compile(st) // the same snapshot again, as a resync compiles it
		}
		want, _ := policy.Compile(st, spec.LocalNode)
		for name, as := range got.AddrSets {
			if as.Prev == nil {
				continue
			}
			m := map[netip.Addr]bool{}
			for a := range as.Prev.Addrs.All() {
				m[a] = true
			}
			for _, a := range as.Removed {
				if !m[a] {
					t.Fatalf("step %d: set %s removes %s, which the previous version lacks", step, name, a)
				}
				delete(m, a)
			}
			for _, a := range as.Added {
				if m[a] {
					t.Fatalf("step %d: set %s adds %s, which the previous version has", step, name, a)
				}
				m[a] = true
			}
			if len(m) != as.Addrs.Len() {
				t.Fatalf("step %d: set %s: previous version plus delta has %d addresses, want %d", step, name, len(m), as.Addrs.Len())
			}
			for a := range as.Addrs.All() {
				if !m[a] {
					t.Fatalf("step %d: set %s: delta misses %s", step, name, a)
				}
			}
		}
		if !reflect.DeepEqual(content(got), content(want)) {
			t.Fatalf("step %d (%s): incremental compile differs from a fresh one:\n%s", step, what, describeDiff(got, want))
		}
	}
}

// clonePod returns a copy of p that may be modified: its labels, addresses and ports are its
// own (p's may be shared with other pods and snapshots).
func clonePod(p *cluster.Pod) *cluster.Pod {
	c := *p
	c.Labels = maps.Clone(p.Labels)
	c.IPs = slices.Clone(p.IPs)
	c.Ports = slices.Clone(p.Ports)
	return &c
}

// podKeys returns the keys of st's pods, sorted.
func podKeys(st *cluster.State) []string {
	var ks []string
	for k := range st.Pods.Keys() {
		ks = append(ks, k)
	}
	return sortedStrings(ks)
}

func sortedStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}

// content strips the version links, which only an incremental compile has.
func content(rs *policy.Ruleset) *policy.Ruleset {
	out := *rs
	out.AddrSets = map[string]*policy.AddrSet{}
	for k, v := range rs.AddrSets {
		out.AddrSets[k] = &policy.AddrSet{Addrs: sortedset.Of(v.Addrs.Slice()...)}
	}
	out.NamedPortSets = map[string]*policy.NamedPortSet{}
	for k, v := range rs.NamedPortSets {
		out.NamedPortSets[k] = &policy.NamedPortSet{Entries: sortedset.Of(v.Entries.Slice()...)}
	}
	out.Dispatch, out.Groups = canonicalGroups(rs.Dispatch, rs.Groups)
	out.Admin.Dispatch, out.Admin.Groups = canonicalGroups(rs.Admin.Dispatch, rs.Admin.Groups)
	out.Baseline.Dispatch, out.Baseline.Groups = canonicalGroups(rs.Baseline.Dispatch, rs.Baseline.Groups)
	return &out
}

// canonicalGroups names each group by its chains: an incremental compile keeps the names of
// groups whose chains changed (to spare the kernel work), a fresh one names them by content.
func canonicalGroups(dispatch map[policy.Direction]map[netip.Addr]string, groups map[string]policy.Group) (map[policy.Direction]map[netip.Addr]string, map[string]policy.Group) {
	canon := func(name string) string {
		g, ok := groups[name]
		if !ok {
			return "missing group " + name
		}
		return string(g.Direction) + ":" + strings.Join(g.Policies, ",")
	}
	outDispatch := map[policy.Direction]map[netip.Addr]string{}
	for dir, m := range dispatch {
		outDispatch[dir] = map[netip.Addr]string{}
		for ip, name := range m {
			outDispatch[dir][ip] = canon(name)
		}
	}
	outGroups := map[string]policy.Group{}
	for name, g := range groups {
		outGroups[canon(name)] = g
	}
	return outDispatch, outGroups
}

func describeDiff(a, b *policy.Ruleset) string {
	out := ""
	for k, v := range a.AddrSets {
		if w, ok := b.AddrSets[k]; !ok || !v.Addrs.Equal(w.Addrs) {
			out += fmt.Sprintf("addrset %s: %v vs %v\n", k, v.Addrs.Slice(), w)
		}
	}
	if !reflect.DeepEqual(a.Dispatch, b.Dispatch) {
		out += "dispatch\n"
	}
	if !reflect.DeepEqual(a.Groups, b.Groups) {
		out += "groups\n"
	}
	if !reflect.DeepEqual(a.Policies, b.Policies) {
		out += "policies\n"
	}
	if len(a.AddrSets) != len(b.AddrSets) {
		out += "addrset count\n"
	}
	return out
}
