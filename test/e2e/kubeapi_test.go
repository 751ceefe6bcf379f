package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestAgentWithKubeAPI runs the agent against a real kube-apiserver: objects are created and
// changed through client-go (pod status written as a kubelet would), and packets follow.
func TestAgentWithKubeAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, true)
		srv := kubetest.Start(t, kubetest.Options{})
		client := srv.AdminClient(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		if err := kubetest.EnsureNamespace(ctx, client, "x", map[string]string{"team": "blue"}); err != nil {
			t.Fatal(err)
		}
		var podsRV uint64
		for _, name := range []string{"a", "b", "c"} {
			tp, err := w.sim.Bed.AddPod("x", name)
			if err != nil {
				t.Fatal(err)
			}
			w.tpods["x/"+name] = tp
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, Labels: map[string]string{"pod": name}},
				Spec: corev1.PodSpec{NodeName: w.sim.NodeName, Containers: []corev1.Container{{Name: "main", Image: "example.invalid/server",
					Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}},
			}
			created, err := client.CoreV1().Pods("x").Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ips []string
			for _, ip := range tp.IPs() {
				ips = append(ips, ip.String())
			}
			running, err := kubetest.SetPodRunning(ctx, client, created, ips...)
			if err != nil {
				t.Fatal(err)
			}
			podsRV = max(podsRV, rvOf(running))
		}
		np := withIngress(netpol("x", "a-from-b", sel("pod", "a")), from(peers(podPeer(selp("pod", "b"))), namedPort(tcp, "web")))
		createdNP, err := client.NetworkingV1().NetworkPolicies("x").Create(ctx, np, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}

		if err := w.sim.ForwardFromNode(strings.TrimPrefix(srv.URL, "https://")); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.StartAgentArgs("--kubeconfig", srv.Kubeconfig(t, "")); err != nil {
			t.Fatal(err)
		}
		// expect waits for the agent to report the write of resource at rv applied, then
		// probes. A probe is repeated once before judging: one lost SYN on a busy machine is
		// not a verdict.
		expect := func(step, resource string, rv uint64, bToA, cToA bool) {
			t.Helper()
			if err := w.sim.WaitResource(15*time.Second, resource, rv); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			probe := func(src string, want bool) {
				t.Helper()
				// An allowed flow gets more tries (a loaded machine loses packets); a denied
				// flow that opens fails at once.
				got := tcpProbe(w, src, "x/a", 80)
				if want && !got {
					got = tcpOpen(w, src, "x/a", 80)
				}
				if got != want {
					t.Fatalf("%s: %s -> x/a: got %v, want %v", step, src, got, want)
				}
			}
			probe("x/b", bToA)
			probe("x/c", cToA)
		}
		if err := w.sim.WaitResource(15*time.Second, "pods", podsRV); err != nil {
			t.Fatal(err)
		}
		expect("policy from the API enforced", "networkpolicies", rvOf(createdNP), true, false)

		// A label change through the API moves pod c into the allowed peers and b out of them.
		relabel := func(name, label string) uint64 {
			t.Helper()
			p, err := client.CoreV1().Pods("x").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Labels["pod"] = label
			p, err = client.CoreV1().Pods("x").Update(ctx, p, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return rvOf(p)
		}
		relabel("b", "z")
		expect("labels changed through the API", "pods", relabel("c", "b"), false, true)

		// The API server goes away: the rules stay enforced, and once it is back the agent
		// catches up with changes made after its return.
		srv.KillAPIServer()
		for range 10 {
			// An allowed probe may time out on a loaded machine; it gets two more tries. A
			// denied probe that passes fails at once.
			allowed := tcpOpen(w, "x/c", "x/a", 80)
			if tcpProbe(w, "x/b", "x/a", 80) || !allowed {
				t.Fatal("enforcement changed while the API server was down")
			}
		}
		srv.StartAPIServer(t)
		expect("change after the API server returned", "pods", relabel("b", "b"), true, true)
		expect("second change after the API server returned", "pods", relabel("c", "c"), true, false)

		// A policy update: admit the pods of namespaces labelled team=green, of which there are none yet.
		cur, err := client.NetworkingV1().NetworkPolicies("x").Get(ctx, "a-from-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers(nsPeer(selp("team", "green")))}}
		cur, err = client.NetworkingV1().NetworkPolicies("x").Update(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		expect("policy updated through the API", "networkpolicies", rvOf(cur), false, false)

		// Relabelling the namespace admits its pods.
		ns, err := client.CoreV1().Namespaces().Get(ctx, "x", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ns.Labels["team"] = "green"
		ns, err = client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		expect("namespace relabelled through the API", "namespaces", rvOf(ns), true, true)

		// A deleted pod is no peer any more, even though its address still sends.
		rv, err := kubetest.DeletePodNow(ctx, client, "x", "c")
		if err != nil {
			t.Fatal(err)
		}
		expect("pod deleted through the API", "pods", rv, true, false)

		// Deleting the policy opens the pod again.
		rv, err = kubetest.DeleteNow(ctx, client.NetworkingV1().RESTClient(), "networkpolicies", "x", "a-from-b")
		if err != nil {
			t.Fatal(err)
		}
		expect("policy deleted through the API", "networkpolicies", rv, true, true)
		w.requireIncremental(t)
	})
}

// rvOf is an object's resourceVersion, as the agent's status compares them.
func rvOf(obj metav1.Object) uint64 { return cluster.ParseResourceVersion(obj.GetResourceVersion()) }
