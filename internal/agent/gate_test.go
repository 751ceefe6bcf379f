package agent

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/gateproto"
	"github.com/netwarden/netwarden/internal/policy"
)

// TestGateOverlayIncremental walks random changes of pods (labels, addresses the API reports,
// deletion) and of the gate's registrations, and checks after each that the compiler fed the
// overlaid states incrementally (with the Changes the overlay makes up) judges every pair of
// addresses as a fresh compile of the same state does: an overlay that came or went and was
// left out of Changes would leave a pod with stale verdicts.
func TestGateOverlayIncremental(t *testing.T) {
	const node = "node-1"
	r := rand.New(rand.NewPCG(1, 2))
	pool := make([]netip.Addr, 12)
	for i := range pool {
		pool[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
	}
	tr := cluster.NewTracker()
	tr.SetNamespace("a", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	tr.SetPolicy("a/web", &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}},
		}})
	g := newGateState()
	cc := policy.NewCompiler(node)
	var rs *policy.Ruleset
	for step := range 400 {
		for range 1 + r.IntN(3) {
			name := fmt.Sprintf("p%d", r.IntN(6))
			key := "a/" + name
			switch r.IntN(5) {
			case 0, 1:
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, Labels: map[string]string{}},
					Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
				if r.IntN(2) == 0 {
					p.Labels["app"] = "web"
				}
				if r.IntN(2) == 0 {
					p.Labels["role"] = "client"
				}
				if r.IntN(2) == 0 {
					p.Status.PodIPs = []corev1.PodIP{{IP: pool[r.IntN(len(pool))].String()}}
				}
				tr.SetPod(key, cluster.PodOf(p))
			case 2:
				tr.SetPod(key, nil)
			case 3:
				g.mu.Lock()
				g.regs[key] = &registration{att: gateproto.Attachment{ContainerID: name}, ips: []netip.Addr{pool[r.IntN(len(pool))]}}
				g.seq++
				g.mu.Unlock()
			case 4:
				g.mu.Lock()
				delete(g.regs, key)
				g.seq++
				g.mu.Unlock()
			}
		}
		cst := g.overlay(tr.Snapshot(), node)
		if rs == nil || !cc.Unchanged(cst) {
			rs, _ = cc.Compile(cst)
		}
		fresh := *cst
		fresh.Generation, fresh.Changes = 0, nil
		want, _ := policy.Compile(&fresh, node)
		for _, local := range pool {
			for _, peer := range pool {
				got := rs.Judge(policy.Ingress, local, peer, policy.TCP, 80).Allowed
				if w := want.Judge(policy.Ingress, local, peer, policy.TCP, 80).Allowed; got != w {
					t.Fatalf("step %d: %s from %s: incremental says allowed=%v, a fresh compile %v", step, local, peer, got, w)
				}
			}
		}
	}
}
