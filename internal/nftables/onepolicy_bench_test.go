package nftables

import (
	"fmt"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// BenchmarkOnePolicyAdded measures the agent's in-process work for one NetworkPolicy added in
// a namespace with local pods, at the benchmark's scale: compile, render and diff, everything
// of a sync but the kernel's share. Each iteration adds a new policy (as the API benchmark
// does), so no step is a repeat of the one before.
func BenchmarkOnePolicyAdded(b *testing.B) {
	spec := synth.Default()
	objects := cluster.NewTrackerFrom(synth.Generate(spec))
	cc := policy.NewCompiler(spec.LocalNode)
	var rd Renderer
	rs, _ := cc.Compile(objects.Snapshot())
	prev := rd.Render(rs)
	i := 0
	for b.Loop() {
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns-00002", Name: fmt.Sprintf("bench-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%10)}}}}}}},
		}
		objects.SetPolicy(cluster.Key(np.Namespace, np.Name), np)
		rs, _ := cc.Compile(objects.Snapshot())
		next := rd.Render(rs)
		if p := diff(prev, next); p.empty() {
			b.Fatal("a new policy changed nothing")
		}
		prev = next
		i++
	}
}
