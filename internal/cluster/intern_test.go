package cluster

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// same reports whether a and b (maps or slices) share their storage.
func same(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.UnsafePointer() == vb.UnsafePointer()
}

func TestInternerLabels(t *testing.T) {
	in := NewInterner()
	a := in.Labels(map[string]string{"app": "web", "tier": "front"})
	b := in.Labels(map[string]string{"tier": "front", "app": "web"})
	if !same(a, b) {
		t.Error("equal label sets do not share one map")
	}
	if want := map[string]string{"app": "web", "tier": "front"}; !reflect.DeepEqual(b, want) {
		t.Errorf("got %v, want %v", b, want)
	}
	// Sets that a naive concatenation of keys and values would confuse.
	for _, m := range []map[string]string{{"app": "webtier"}, {"appweb": "tier"}, {"app": "web", "tier": ""}, {"app": "web"}} {
		if got := in.Labels(m); same(got, a) || !reflect.DeepEqual(got, m) {
			t.Errorf("Labels(%v) = %v, shared with %v", m, got, a)
		}
	}
	if in.Labels(nil) != nil {
		t.Error("nil labels interned as non-nil")
	}
	e1, e2 := in.Labels(map[string]string{}), in.Labels(map[string]string{})
	if e1 == nil || len(e1) != 0 || !same(e1, e2) {
		t.Errorf("empty label sets: %v %v, shared %v", e1, e2, same(e1, e2))
	}
	var none *Interner
	m := map[string]string{"a": "b"}
	if !same(none.Labels(m), m) {
		t.Error("the nil Interner does not return its input")
	}
}

// TestInternerBounded interns more distinct label sets and port lists than the tables hold:
// they never grow past internLimit, and still share equal sets afterwards.
func TestInternerBounded(t *testing.T) {
	in := NewInterner()
	for i := range 3*internLimit + 5 {
		in.Labels(map[string]string{"app": "web", "pod-template-hash": fmt.Sprint(i)})
		in.containerPortList([]corev1.Container{{Ports: []corev1.ContainerPort{{ContainerPort: int32(i + 1)}}}})
		in.String(fmt.Sprint("ns-", i))
		if len(in.labels) > internLimit || len(in.ports) > internLimit || len(in.strings) > internLimit {
			t.Fatalf("after %d sets: %d label sets, %d port lists, %d strings held", i+1, len(in.labels), len(in.ports), len(in.strings))
		}
	}
	a := in.Labels(map[string]string{"app": "db"})
	if b := in.Labels(map[string]string{"app": "db"}); !same(a, b) {
		t.Error("equal label sets not shared after the table was started again")
	}
}

func testPod(name, app string, port int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": app}, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{
			NodeName:       "node-0",
			InitContainers: []corev1.Container{{Name: "init"}},
			Containers: []corev1.Container{
				{Name: "main", Image: "img", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: port, Protocol: corev1.ProtocolTCP, HostPort: 8080}}},
				{Name: "side"},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
	}
}

func TestInternerPod(t *testing.T) {
	in := NewInterner()
	p1, p2, p3 := testPod("a", "web", 80), testPod("b", "web", 80), testPod("c", "db", 5432)
	for _, p := range []*corev1.Pod{p1, p2, p3} {
		DefaultPod(p)
	}
	s1, s2, s3 := in.Pod(p1), in.Pod(p2), in.Pod(p3)
	want := &Pod{Namespace: "ns", Name: "a", Labels: map[string]string{"app": "web"}, NodeName: "node-0", Phase: corev1.PodRunning,
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ports: []ContainerPort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}
	if !reflect.DeepEqual(s1, want) {
		t.Errorf("kept %+v\nwant %+v", s1, want)
	}
	if got := (*Interner)(nil).Pod(p1); !reflect.DeepEqual(got, want) {
		t.Errorf("kept without an Interner %+v\nwant %+v", got, want)
	}
	if !same(s1.Labels, s2.Labels) || &s1.Ports[0] != &s2.Ports[0] || unsafe.StringData(s1.NodeName) != unsafe.StringData(s2.NodeName) {
		t.Error("equal labels, ports or node names of two pods are not shared")
	}
	if same(s1.Labels, s3.Labels) || &s1.Ports[0] == &s3.Ports[0] {
		t.Error("different labels or ports are shared")
	}
	if back := PodOf(s1.APIObject()); !reflect.DeepEqual(back, s1) {
		t.Errorf("APIObject and PodOf do not round-trip: %+v, want %+v", back, s1)
	}
	mapped := testPod("d", "web", 80)
	mapped.Status.PodIPs, mapped.Status.PodIP = []corev1.PodIP{{IP: "::ffff:10.0.0.4"}, {IP: "fd00::4"}}, ""
	if got := in.Pod(mapped).IPs; !reflect.DeepEqual(got, []netip.Addr{netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("fd00::4")}) {
		t.Errorf("IPs %v, want podIPs in their order, unmapped", got)
	}
}

func TestInternerStripNetworkPolicy(t *testing.T) {
	tcp := corev1.ProtocolTCP
	policy := func(name string) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"team": "a"}},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp}},
					From: []networkingv1.NetworkPolicyPeer{
						{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, NamespaceSelector: &metav1.LabelSelector{}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}},
					},
				}, {}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			},
		}
	}
	in := NewInterner()
	n1, n2 := policy("a"), policy("b")
	before := n1.DeepCopy()
	s1, s2 := in.StripNetworkPolicy(n1), in.StripNetworkPolicy(n2)
	if want := StripNetworkPolicy(before); !reflect.DeepEqual(s1, want) {
		t.Errorf("interned %+v\nwant %+v", s1, want)
	}
	if !reflect.DeepEqual(n1, before) {
		t.Error("the input was written")
	}
	if !same(s1.Labels, s2.Labels) || !same(s1.Spec.PodSelector.MatchLabels, s2.Spec.PodSelector.MatchLabels) ||
		!same(s1.Spec.Ingress[0].From[0].PodSelector.MatchLabels, s2.Spec.Ingress[0].From[0].PodSelector.MatchLabels) {
		t.Error("equal label sets of two policies are not shared")
	}
}
