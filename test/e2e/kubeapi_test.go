package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/kubetest"
	"github.com/netwarden/netwarden/internal/testbed"
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
			if _, err := kubetest.SetPodRunning(ctx, client, created, ips...); err != nil {
				t.Fatal(err)
			}
		}
		np := withIngress(netpol("x", "a-from-b", sel("pod", "a")), from(peers(podPeer(selp("pod", "b"))), namedPort(tcp, "web")))
		if _, err := client.NetworkingV1().NetworkPolicies("x").Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		if err := w.sim.ForwardFromNode(strings.TrimPrefix(srv.URL, "https://")); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.StartAgentArgs("--kubeconfig", srv.Kubeconfig(t, "")); err != nil {
			t.Fatal(err)
		}
		expect := func(step string, bToA, cToA bool) {
			t.Helper()
			waitFor(t, 15*time.Second, step, func() bool {
				return tcpProbe(w, "x/b", "x/a", 80) == bToA && tcpProbe(w, "x/c", "x/a", 80) == cToA
			})
		}
		expect("policy from the API enforced", true, false)

		// A label change through the API moves pod c into the allowed peers and b out of them.
		for name, label := range map[string]string{"b": "z", "c": "b"} {
			p, err := client.CoreV1().Pods("x").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Labels["pod"] = label
			if _, err := client.CoreV1().Pods("x").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		expect("labels changed through the API", false, true)

		// The API server goes away: the rules stay enforced, and once it is back the agent
		// catches up with changes made after its return.
		srv.KillAPIServer()
		time.Sleep(2 * time.Second)
		if tcpProbe(w, "x/b", "x/a", 80) || !tcpProbe(w, "x/c", "x/a", 80) {
			t.Fatal("enforcement changed while the API server was down")
		}
		srv.StartAPIServer(t)
		p, err := client.CoreV1().Pods("x").Get(ctx, "b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Labels["pod"] = "b"
		if _, err := client.CoreV1().Pods("x").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		expect("change after the API server returned", true, true)
		p, err = client.CoreV1().Pods("x").Get(ctx, "c", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Labels["pod"] = "c"
		if _, err := client.CoreV1().Pods("x").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		expect("second change after the API server returned", true, false)

		// A policy update: admit the pods of namespaces labelled team=green, of which there are none yet.
		cur, err := client.NetworkingV1().NetworkPolicies("x").Get(ctx, "a-from-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers(nsPeer(selp("team", "green")))}}
		if _, err := client.NetworkingV1().NetworkPolicies("x").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		expect("policy updated through the API", false, false)

		// Relabelling the namespace admits its pods.
		ns, err := client.CoreV1().Namespaces().Get(ctx, "x", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ns.Labels["team"] = "green"
		if _, err := client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		expect("namespace relabelled through the API", true, true)

		// A deleted pod is no peer any more, even though its address still sends.
		if err := kubetest.DeletePodNow(ctx, client, "x", "c"); err != nil {
			t.Fatal(err)
		}
		expect("pod deleted through the API", true, false)

		// Deleting the policy opens the pod again.
		if err := client.NetworkingV1().NetworkPolicies("x").Delete(ctx, "a-from-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		expect("policy deleted through the API", true, true)
		w.requireIncremental(t)
	})
}
