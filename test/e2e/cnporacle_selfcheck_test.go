package e2e

// Self-checks of the ClusterNetworkPolicy oracle, with no kernel: the translation of the upstream
// conformance suite against its sources, every upstream expectation against the oracle, and a
// few semantic points the suite does not reach.

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// fakeConfCluster is the suite's base cluster with addresses as the kernel suite's test bed
// hands them out: replica 0 of each StatefulSet on node-1, replica 1 on node-2, and the host
// network pods at their node's InternalIPs.
func fakeConfCluster() (*cnpCluster, error) {
	node1, node2, place := fakeNodes()
	return loadConfBase(func(ns, name string, replica int, hostNetwork bool) (string, []netip.Addr, error) {
		node := []string{"node-1", "node-2"}[replica%2]
		ips, err := place(ns, name, node, hostNetwork)
		return node, ips, err
	}, []*corev1.Node{node1, node2})
}

// fakeNodes returns node-1 and node-2 as the kernel tests' bed makes them, and a placer that
// hands out pod addresses from their pod CIDRs (host network pods get their node's InternalIPs).
func fakeNodes() (*corev1.Node, *corev1.Node, func(ns, name, node string, hostNetwork bool) ([]netip.Addr, error)) {
	node1 := confNode("node-1",
		[]netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:10:244::/64")},
		[]netip.Addr{netip.MustParseAddr("10.255.0.1"), netip.MustParseAddr("fd00:255::1")},
		[]netip.Addr{netip.MustParseAddr("10.244.0.1"), netip.MustParseAddr("fd00:10:244::1")})
	node2 := confNode("node-2",
		[]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		[]netip.Addr{netip.MustParseAddr("10.255.0.2"), netip.MustParseAddr("fd00:255::2")}, nil)
	nodes := map[string]*corev1.Node{"node-1": node1, "node-2": node2}
	next := map[string]int{}
	place := func(ns, name, nodeName string, hostNetwork bool) ([]netip.Addr, error) {
		node := nodes[nodeName]
		if node == nil {
			return nil, fmt.Errorf("no node %s", nodeName)
		}
		if hostNetwork {
			var ips []netip.Addr
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					ips = append(ips, netip.MustParseAddr(a.Address))
				}
			}
			return ips, nil
		}
		next[node.Name]++
		var ips []netip.Addr
		for _, c := range node.Spec.PodCIDRs {
			ip := netip.MustParsePrefix(c).Addr()
			for range 9 + next[node.Name] {
				ip = ip.Next()
			}
			ips = append(ips, ip)
		}
		return ips, nil
	}
	return node1, node2, place
}

// confConns lists the connections of a poke: one per family both pods have.
func confConns(c *cnpCluster, p confPoke) ([]cnpConn, error) {
	src, err := confPodRef(c, p.From)
	if err != nil {
		return nil, err
	}
	dst, err := confPodRef(c, p.To)
	if err != nil {
		return nil, err
	}
	var out []cnpConn
	for _, d := range podAddrs(dst) {
		for _, s := range podAddrs(src) {
			if s.Is4() == d.Is4() {
				out = append(out, cnpConn{SrcIP: s, DstIP: d, Proto: corev1.Protocol(strings.ToUpper(p.Proto)), Port: p.Port})
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: the pods share no address family", p)
	}
	return out, nil
}

// TestCNPConformanceTranslation holds the translated tables against the upstream test sources:
// the same tests in the same order, with the same manifests and features, the same runs, and in
// each run the same PokeServer calls (client, protocol, server, port, expectation) in order.
func TestCNPConformanceTranslation(t *testing.T) {
	uts, err := parseUpstreamTests()
	if err != nil {
		t.Fatal(err)
	}
	if len(uts) != len(confTests) {
		var names []string
		for _, ut := range uts {
			names = append(names, ut.Name)
		}
		t.Fatalf("upstream has %d tests, the translation %d; upstream: %v", len(uts), len(confTests), names)
	}
	pokes := 0
	for i, ut := range uts {
		ct := confTests[i]
		if ct.Name != ut.Name {
			t.Errorf("test %d: upstream %s, translated %s", i, ut.Name, ct.Name)
			continue
		}
		if !reflect.DeepEqual(ct.Manifests, ut.Manifests) || !reflect.DeepEqual(ct.Features, ut.Features) {
			t.Errorf("%s: manifests/features %v %v, upstream %v %v", ct.Name, ct.Manifests, ct.Features, ut.Manifests, ut.Features)
		}
		if len(ct.Runs) != len(ut.Runs) {
			t.Errorf("%s: %d runs, upstream %d", ct.Name, len(ct.Runs), len(ut.Runs))
			continue
		}
		for j, ur := range ut.Runs {
			cr := ct.Runs[j]
			if cr.Name != ur.Name {
				t.Errorf("%s run %d: %q, upstream %q", ct.Name, j, cr.Name, ur.Name)
			}
			var got []upstreamPoke
			for _, s := range cr.Steps {
				for _, p := range s.Pokes {
					got = append(got, upstreamPoke(p))
				}
			}
			if !reflect.DeepEqual(got, ur.Pokes) {
				t.Errorf("%s / %s: pokes differ from upstream:\ntranslated: %v\nupstream:   %v", ct.Name, ur.Name, got, ur.Pokes)
			}
			pokes += len(ur.Pokes)
		}
	}
	t.Logf("%d upstream tests, %d PokeServer calls, translated alike", len(uts), pokes)
}

// TestCNPOracleConformance runs every translated upstream test against the oracle: each
// expectation, before and after the tests' mutations, must be the oracle's verdict, in each
// address family.
func TestCNPOracleConformance(t *testing.T) {
	c, err := fakeConfCluster()
	if err != nil {
		t.Fatal(err)
	}
	checked, allowed := 0, 0
	for _, ct := range confTests {
		t.Run(ct.Name, func(t *testing.T) {
			if _, err := applyConfManifests(c, ct.Manifests); err != nil {
				t.Fatal(err)
			}
			defer deleteConfManifests(c)
			for _, b := range ct.batches() {
				for _, m := range b.Mutations {
					if err := m.Apply(c); err != nil {
						t.Fatalf("%s: %v", m.Desc, err)
					}
				}
				o := newCNPOracle(c)
				for _, p := range b.Pokes {
					conns, err := confConns(c, p.confPoke)
					if err != nil {
						t.Fatal(err)
					}
					for _, conn := range conns {
						v := o.Judge(conn)
						checked++
						if v.Allowed() {
							allowed++
						}
						if v.Allowed() != p.Want {
							t.Errorf("%s / %s: %s (%s): upstream expects %s, the oracle says %s", ct.Name, p.Run, p.confPoke, conn, verdict(p.Want), v)
						}
					}
				}
			}
		})
	}
	t.Logf("%d upstream tests: %d pokes checked against the oracle over both families (%d allowed, %d denied)", len(confTests), checked, allowed, checked-allowed)
}

// TestCNPOracleSemantics pins points of the API the upstream suite does not probe.
func TestCNPOracleSemantics(t *testing.T) {
	base, err := fakeConfCluster()
	if err != nil {
		t.Fatal(err)
	}
	pod := func(c *cnpCluster, short string, fam int) netip.Addr {
		for _, ip := range podAddrs(c.Pods[confKey(short)]) {
			if ip.Is4() == (fam == 4) {
				return ip
			}
		}
		t.Fatalf("%s has no IPv%d address", short, fam)
		return netip.Addr{}
	}
	nsSel := func(short string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: confKey(short)}}
	}
	subjectNS := func(short string) npav1beta1.ClusterNetworkPolicySubject {
		return npav1beta1.ClusterNetworkPolicySubject{Namespaces: nsSel(short)}
	}
	cnp := func(name string, tier npav1beta1.Tier, prio int32, subj npav1beta1.ClusterNetworkPolicySubject) *npav1beta1.ClusterNetworkPolicy {
		return &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subj}}
	}
	eg := func(a npav1beta1.ClusterNetworkPolicyRuleAction, to []npav1beta1.ClusterNetworkPolicyEgressPeer, protos ...npav1beta1.ClusterNetworkPolicyProtocol) npav1beta1.ClusterNetworkPolicyEgressRule {
		return npav1beta1.ClusterNetworkPolicyEgressRule{Action: a, To: to, Protocols: protos}
	}
	ig := func(a npav1beta1.ClusterNetworkPolicyRuleAction, from []npav1beta1.ClusterNetworkPolicyIngressPeer, protos ...npav1beta1.ClusterNetworkPolicyProtocol) npav1beta1.ClusterNetworkPolicyIngressRule {
		return npav1beta1.ClusterNetworkPolicyIngressRule{Action: a, From: from, Protocols: protos}
	}
	toNS := func(short string) []npav1beta1.ClusterNetworkPolicyEgressPeer {
		return []npav1beta1.ClusterNetworkPolicyEgressPeer{{Namespaces: nsSel(short)}}
	}
	fromNS := func(short string) []npav1beta1.ClusterNetworkPolicyIngressPeer {
		return []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: nsSel(short)}}
	}
	const (
		accept = npav1beta1.ClusterNetworkPolicyRuleActionAccept
		deny   = npav1beta1.ClusterNetworkPolicyRuleActionDeny
		pass   = npav1beta1.ClusterNetworkPolicyRuleActionPass
		admin  = npav1beta1.AdminTier
		bl     = npav1beta1.BaselineTier
	)
	tcpPort := func(n int32) npav1beta1.ClusterNetworkPolicyProtocol {
		return npav1beta1.ClusterNetworkPolicyProtocol{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: n}}}
	}
	named := func(n string) npav1beta1.ClusterNetworkPolicyProtocol {
		return npav1beta1.ClusterNetworkPolicyProtocol{DestinationNamedPort: n}
	}
	denyAllNP := func(short string, types ...networkingv1.PolicyType) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: confKey(short), Name: "deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: types}}
	}
	type probe struct {
		from, to string // pods, or "node1-internal" etc. for a destination address
		proto    corev1.Protocol
		port     int
		want     bool
		tier     string // the tier expected to decide the denying (or only) direction; "-" skips
	}
	addr := map[string]netip.Addr{
		"node-1 InternalIP": netip.MustParseAddr("10.255.0.1"), "node-1 ExternalIP": netip.MustParseAddr("10.244.0.1"),
		"node-2 InternalIP": netip.MustParseAddr("10.255.0.2"), "node-2 unlisted": netip.MustParseAddr("10.244.1.1"),
	}
	cases := []struct {
		name   string
		cnps   []*npav1beta1.ClusterNetworkPolicy
		nps    []*networkingv1.NetworkPolicy
		mut    func(c *cnpCluster)
		probes []probe
	}{
		{name: "equal priorities are ordered by name", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("b-deny", admin, 5, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(deny, toNS("slytherin")))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("a-accept", admin, 5, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(accept, toNS("slytherin"), tcpPort(80)))
				return p
			}(),
		}, probes: []probe{{hp0, dm0, "TCP", 80, true, "Admin"}, {hp0, dm0, "TCP", 8080, false, "Admin"}}},
		{name: "lower priority number first", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("a", admin, 7, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(accept, toNS("slytherin")))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("b", admin, 6, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(deny, toNS("slytherin")))
				return p
			}(),
		}, probes: []probe{{hp0, dm0, "TCP", 80, false, "Admin"}}},
		{name: "admin Accept wins over NetworkPolicy isolation; baseline Deny loses to NetworkPolicy allow", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("acc", admin, 1, subjectNS("gryffindor"))
				p.Spec.Ingress = append(p.Spec.Ingress, ig(accept, fromNS("ravenclaw")))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("den", bl, 1, subjectNS("slytherin"))
				p.Spec.Ingress = append(p.Spec.Ingress, ig(deny, fromNS("gryffindor")))
				return p
			}(),
		}, nps: []*networkingv1.NetworkPolicy{
			denyAllNP("gryffindor", networkingv1.PolicyTypeIngress),
			{ObjectMeta: metav1.ObjectMeta{Namespace: confKey("slytherin"), Name: "from-gryffindor"}, Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{appsPodName: "draco-malfoy-0"}},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: nsSel("gryffindor")}}}}}},
		}, probes: []probe{
			{ll0, hp0, "TCP", 80, true, "Admin"},
			{cd0, hp0, "TCP", 80, false, "NetworkPolicy"},
			{hp0, dm0, "TCP", 80, true, "NetworkPolicy"},
			{hp0, dm1, "TCP", 80, false, "Baseline"},
		}},
		{name: "Pass in baseline goes to the default; Pass in admin skips the rest of admin only", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("a1", admin, 1, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(pass, toNS("slytherin")))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("a2", admin, 2, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(deny, toNS("slytherin")), eg(deny, toNS("ravenclaw")))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("b1", bl, 1, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(pass, toNS("slytherin"), tcpPort(80)), eg(deny, toNS("slytherin")))
				return p
			}(),
		}, probes: []probe{
			{hp0, dm0, "TCP", 80, true, ""},
			{hp0, dm0, "TCP", 8080, false, "Baseline"},
			{hp0, ll0, "TCP", 80, false, "Admin"},
		}},
		{name: "networks match pod addresses; nodes match InternalIP and ExternalIP only", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("n", admin, 1, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress,
					eg(accept, []npav1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/os": "linux"}}}}, tcpPort(80)),
					eg(deny, []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"10.0.0.0/8", "fd00::/8"}}}))
				return p
			}(),
		}, probes: []probe{
			{hp0, "node-1 InternalIP", "TCP", 80, true, "Admin"},
			{hp0, "node-1 ExternalIP", "TCP", 80, true, "Admin"},
			{hp0, "node-2 InternalIP", "TCP", 80, true, "Admin"},
			{hp0, "node-2 unlisted", "TCP", 80, false, "Admin"},
			{hp0, "node-1 InternalIP", "UDP", 80, false, "Admin"},
			{hp0, ll1, "TCP", 80, false, "Admin"},
		}},
		{name: "host network pods are neither subjects nor pod peers", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("hn", admin, 1, subjectNS("forbidden-forrest"))
				p.Spec.Ingress = append(p.Spec.Ingress, ig(deny, fromNS("gryffindor")))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("to-ff", admin, 2, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(deny, toNS("forbidden-forrest")))
				return p
			}(),
		}, probes: []probe{{hp0, cen1, "TCP", 80, true, ""}}},
		{name: "named ports resolve on the destination pod with its protocol", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("np", admin, 1, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress, eg(accept, toNS("slytherin"), named("dns")), eg(deny, toNS("slytherin")))
				return p
			}(),
		}, probes: []probe{{hp0, dm0, "UDP", 53, true, "Admin"}, {hp0, dm0, "TCP", 53, false, "Admin"}, {hp0, dm0, "UDP", 5353, false, "Admin"}}},
		{name: "a peer with no known field fails closed", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("fc", admin, 1, subjectNS("gryffindor"))
				p.Spec.Egress = append(p.Spec.Egress,
					eg(accept, []npav1beta1.ClusterNetworkPolicyEgressPeer{{DomainNames: []npav1beta1.DomainName{"example.com"}}}),
					eg(deny, []npav1beta1.ClusterNetworkPolicyEgressPeer{{}}, tcpPort(80)))
				p.Spec.Ingress = append(p.Spec.Ingress, ig(pass, []npav1beta1.ClusterNetworkPolicyIngressPeer{{}}, tcpPort(8080)))
				return p
			}(),
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("fc2", admin, 2, subjectNS("gryffindor"))
				p.Spec.Ingress = append(p.Spec.Ingress, ig(deny, fromNS("slytherin")))
				return p
			}(),
		}, probes: []probe{
			{hp0, ll0, "TCP", 80, false, "Admin"},
			{hp0, ll0, "TCP", 8080, true, ""},
			{dm0, hp0, "TCP", 8080, true, ""},
			{dm0, hp0, "TCP", 80, false, "Admin"},
		}},
		{name: "pods subject with an empty namespaceSelector; a label change moves a pod out", cnps: []*npav1beta1.ClusterNetworkPolicy{
			func() *npav1beta1.ClusterNetworkPolicy {
				p := cnp("ps", bl, 3, npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{
					PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "conformance-house", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"gryffindor"}}}}}})
				p.Spec.Ingress = append(p.Spec.Ingress, ig(deny, []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &npav1beta1.NamespacedPod{}}}))
				return p
			}(),
		}, mut: func(c *cnpCluster) { delete(c.Pods[confKey(ll1)].Labels, "conformance-house") }, probes: []probe{
			{hp0, dm0, "TCP", 80, false, "Baseline"},
			{dm0, hp0, "TCP", 80, true, ""},
			{hp0, ll1, "TCP", 80, false, "Baseline"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base.DeepCopy()
			for _, p := range tc.cnps {
				c.CNPs[p.Name] = p
			}
			for _, np := range tc.nps {
				c.NPs[np.Namespace+"/"+np.Name] = np
			}
			if tc.mut != nil {
				tc.mut(c)
			}
			o := newCNPOracle(c)
			for _, pr := range tc.probes {
				for _, fam := range []int{4, 6} {
					dst, ok := addr[pr.to]
					if !ok {
						dst = pod(c, pr.to, fam)
					} else if fam == 6 {
						continue
					}
					v := o.Judge(cnpConn{SrcIP: pod(c, pr.from, fam), DstIP: dst, Proto: pr.proto, Port: pr.port})
					if v.Allowed() != pr.want {
						t.Errorf("%s -> %s %s/%d IPv%d: want %s, oracle: %s", pr.from, pr.to, pr.proto, pr.port, fam, verdict(pr.want), v)
						continue
					}
					d := v.Egress
					if !v.Ingress.Allowed || (v.Egress.Allowed && v.Ingress.Tier != "") {
						d = v.Ingress
					}
					if pr.tier != "-" && d.Tier != pr.tier {
						t.Errorf("%s -> %s %s/%d IPv%d: decided by tier %q, want %q: %s", pr.from, pr.to, pr.proto, pr.port, fam, d.Tier, pr.tier, v)
					}
				}
			}
		})
	}
}

const appsPodName = "statefulset.kubernetes.io/pod-name"
