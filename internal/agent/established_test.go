package agent

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/conntrack"
	"github.com/netwarden/netwarden/internal/policy"
)

// TestJudgeFlow: a flow is judged as the kernel judged its first packet: after DNAT (a
// Service address is its endpoint, the reply's source), with the original source, and never
// for ingress when the node itself opened it.
func TestJudgeFlow(t *testing.T) {
	st := cluster.NewState()
	pod := func(name, ip string, labels map[string]string) {
		st.Pods.Set("a/"+name, cluster.PodOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}}}))
	}
	pod("srv", "10.0.0.1", map[string]string{"app": "srv"})
	pod("ok", "10.0.0.2", map[string]string{"role": "ok"})
	pod("other", "10.0.0.3", nil)
	port := intstr.FromInt32(8443)
	st.Policies["a/srv"] = &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "srv"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "srv"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "ok"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		}}
	rs, _ := policy.Compile(st, "n")
	a := netip.MustParseAddr
	vip := a("10.96.0.10")
	node := map[netip.Addr]bool{a("10.0.0.254"): true}
	for _, tc := range []struct {
		name   string
		f      conntrack.Flow
		denied bool
	}{
		{"allowed peer through a Service", conntrack.Flow{Protocol: 6, Src: a("10.0.0.2"), Dst: vip, DstPort: 443, ReplySrc: a("10.0.0.1"), ReplySrcPort: 8443}, false},
		{"other peer through a Service", conntrack.Flow{Protocol: 6, Src: a("10.0.0.3"), Dst: vip, DstPort: 443, ReplySrc: a("10.0.0.1"), ReplySrcPort: 8443}, true},
		{"allowed peer on another port", conntrack.Flow{Protocol: 17, Src: a("10.0.0.2"), Dst: a("10.0.0.1"), DstPort: 53, ReplySrc: a("10.0.0.1"), ReplySrcPort: 53}, true},
		{"the node itself", conntrack.Flow{Protocol: 6, Src: a("10.0.0.254"), Dst: a("10.0.0.1"), DstPort: 22, ReplySrc: a("10.0.0.1"), ReplySrcPort: 22}, false},
		{"from the isolated pod, whose egress is open", conntrack.Flow{Protocol: 6, Src: a("10.0.0.1"), Dst: a("10.0.0.3"), DstPort: 80, ReplySrc: a("10.0.0.3"), ReplySrcPort: 80}, false},
	} {
		if got := judgeFlow(rs, tc.f, node); got != tc.denied {
			t.Errorf("%s: denied=%v, want %v", tc.name, got, tc.denied)
		}
		if !concerns(rs, tc.f) && tc.denied {
			t.Errorf("%s: a denied flow not considered", tc.name)
		}
	}
}
