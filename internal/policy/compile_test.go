package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
)

func pod(ns, name, node, ip string, lbl map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name:  "c",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func testState() *cluster.State {
	st := cluster.NewState()
	for _, ns := range []string{"a", "b"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		cluster.DefaultNamespace(n)
		st.Namespaces[ns] = n
	}
	for _, p := range []*corev1.Pod{
		pod("a", "web", "n1", "10.0.0.1", map[string]string{"app": "web"}),
		pod("a", "db", "n1", "10.0.0.2", map[string]string{"app": "db"}),
		pod("b", "client", "n2", "10.0.1.1", map[string]string{"app": "client"}),
	} {
		st.Pods.Set(cluster.Key(p.Namespace, p.Name), cluster.PodOf(p))
	}
	tcp := corev1.ProtocolTCP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.1.0/24"}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{
					{Protocol: &tcp, Port: &intstr.IntOrString{Type: intstr.String, StrVal: "http"}},
					{Protocol: &tcp, Port: &intstr.IntOrString{IntVal: 80}},
				},
			}},
		},
	}
	cluster.DefaultNetworkPolicy(np)
	st.Policies[cluster.Key(np.Namespace, np.Name)] = np
	return st
}

func TestCompileSelectsOnlyLocalTargets(t *testing.T) {
	rs, stats := Compile(testState(), "n1")
	if stats.LocalPods != 2 || stats.IsolatedPods != 1 || stats.PoliciesSelecting != 1 {
		t.Fatalf("stats = %+v", stats)
	}
	web := netip.MustParseAddr("10.0.0.1")
	grp, ok := rs.Dispatch[Ingress][web]
	if !ok || len(rs.Dispatch[Ingress]) != 1 || len(rs.Dispatch[Egress]) != 0 {
		t.Fatalf("dispatch = %v", rs.Dispatch)
	}
	if got := rs.Groups[grp].Policies; !slices.Equal(got, []string{"in/a/web"}) {
		t.Fatalf("group policies = %v", got)
	}
	rules := rs.Policies["in/a/web"].Rules
	if len(rules) != 1 || len(rules[0].Peers) != 2 || len(rules[0].Ports) != 2 {
		t.Fatalf("rules = %+v", rules)
	}
	peerSet := rs.AddrSets[rules[0].Peers[0].AddrSet].Addrs.Slice()
	if !slices.Equal(peerSet, []netip.Addr{netip.MustParseAddr("10.0.1.1")}) {
		t.Fatalf("peer set = %v (remote pods are peers too)", peerSet)
	}
	cidrs := rs.CIDRSets[rules[0].Peers[1].CIDRSet].Prefixes
	if len(cidrs) != 8 { // /16 minus a /24 leaves one prefix each of /17 ... /24
		t.Fatalf("cidr set = %v", cidrs)
	}
	named := rs.NamedPortSets[rules[0].Ports[1].NamedPortSet].Entries.Slice()
	if len(named) != 3 {
		t.Fatalf("named port set = %v", named)
	}

	// The remote node compiles nothing for these pods: its only pod is not selected.
	rs2, stats2 := Compile(testState(), "n2")
	if stats2.IsolatedPods != 0 || len(rs2.Policies) != 0 {
		t.Fatalf("n2: %+v %v", stats2, rs2.Policies)
	}
}

func TestIneligiblePodsAreNeitherTargetsNorPeers(t *testing.T) {
	st := testState()
	client := *st.Pods.Get("b/client")
	client.Phase = corev1.PodSucceeded
	st.Pods.Set("b/client", &client)
	web := *st.Pods.Get("a/web")
	web.HostNetwork = true
	st.Pods.Set("a/web", &web)
	rs, stats := Compile(st, "n1")
	if stats.IsolatedPods != 0 || len(rs.AddrSets) != 0 {
		t.Fatalf("stats=%+v sets=%v", stats, rs.AddrSets)
	}
}

func TestSubtractPrefixes(t *testing.T) {
	got := SubtractPrefixes(netip.MustParsePrefix("10.0.0.0/30"), []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")})
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/32"), netip.MustParsePrefix("10.0.0.2/31")}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if got := SubtractPrefixes(netip.MustParsePrefix("fd00::/64"), []netip.Prefix{netip.MustParsePrefix("fd00::/64")}); len(got) != 0 {
		t.Fatalf("fully excepted: %v", got)
	}
}

// TestSubtractPrefixesRandom checks every address of a small block against random,
// overlapping excepts, and that the result is disjoint and in order.
func TestSubtractPrefixesRandom(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	block := netip.MustParsePrefix("10.0.0.0/24")
	for round := 0; round < 200; round++ {
		var except []netip.Prefix
		for range rnd.IntN(6) {
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(rnd.IntN(256))})
			except = append(except, netip.PrefixFrom(a, 25+rnd.IntN(8)).Masked())
		}
		got := SubtractPrefixes(block, except)
		for i := 1; i < len(got); i++ {
			if got[i-1].Overlaps(got[i]) || !got[i-1].Addr().Less(got[i].Addr()) {
				t.Fatalf("%v minus %v: %v is not disjoint and sorted", block, except, got)
			}
		}
		for i := range 256 {
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
			excluded := slices.ContainsFunc(except, func(e netip.Prefix) bool { return e.Contains(a) })
			covered := slices.ContainsFunc(got, func(p netip.Prefix) bool { return p.Contains(a) })
			if covered == excluded {
				t.Fatalf("%v minus %v = %v: %s covered=%v", block, except, got, a, covered)
			}
		}
	}
}

// TestSubtractManyExcepts: the API puts no limit on excepts; ten thousand under ::/0 take
// about a million prefixes and must not take quadratic time.
func TestSubtractManyExcepts(t *testing.T) {
	var except []netip.Prefix
	for i := range 10000 {
		except = append(except, netip.PrefixFrom(manyExceptsAddr(i), 128))
	}
	start := time.Now()
	got := SubtractPrefixes(netip.MustParsePrefix("::/0"), except)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
	if len(got) < 1<<20 {
		t.Fatalf("%d prefixes, want over a million", len(got))
	}
	for _, e := range except[:100] {
		if slices.ContainsFunc(got, func(p netip.Prefix) bool { return p.Contains(e.Addr()) }) {
			t.Fatalf("%s not excepted", e)
		}
	}
}

// manyExceptsAddr spreads addresses over the whole IPv6 space, so few share a long prefix.
func manyExceptsAddr(i int) netip.Addr {
	var b [16]byte
	x := uint64(i+1) * 0x9e3779b97f4a7c15
	for j := range 8 {
		b[j] = byte(x >> (8 * j))
		b[8+j] = byte(x >> (8 * (7 - j)))
	}
	return netip.AddrFrom16(b)
}

func TestMergeRanges(t *testing.T) {
	got := mergeRanges([]PortRange{{90, 100}, {80, 80}, {81, 85}, {95, 120}})
	want := []PortRange{{80, 85}, {90, 120}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
}
