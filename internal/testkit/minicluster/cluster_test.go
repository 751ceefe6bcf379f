package minicluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/minicluster"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
)

func upstreamCNI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := minicluster.BuildUpstreamCNI(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestClusterServesPodsServicesAndPolicies starts two nodes and checks what the suites build
// on: a Deployment spread over both nodes by the real scheduler, Ready pods whose agnhost
// answers, `kubectl exec` through the API server, a ClusterIP Service through kube-proxy from
// the other node, and a NetworkPolicy that netwarden enforces and then lifts.
func TestClusterServesPodsServicesAndPolicies(t *testing.T) {
	kerneltest.RequireAgent(t, simnode.AgentBinary)
	agent, _ := simnode.AgentBinary()
	for _, p := range []string{"netwarden-portmap", "netwarden-gate"} {
		if _, err := os.Stat(filepath.Join(filepath.Dir(agent), p)); err != nil {
			t.Fatalf("%s is not next to %s (make build puts them together): %v", p, agent, err)
		}
	}
	c := minicluster.Start(t, minicluster.Options{Nodes: 2, AgentBin: agent, CNIBinDirs: []string{upstreamCNI(t), filepath.Dir(agent)}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	ns := "demo"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					Containers: []corev1.Container{{
						Name: "web", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
						Args:  []string{"serve-hostname", "--tcp", "--http=false", "--port", "8080"},
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := waitReadyPods(t, ctx, c, ns, "app=web", 2)
	if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Fatalf("both pods on %s: the spread constraint should put one on each node", pods[0].Spec.NodeName)
	}
	a, b := pods[0], pods[1]

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	connect := func(from corev1.Pod, target string) error {
		_, stderr, err := c.Exec(ctx, ns, from.Name, "web", "/agnhost", "connect", target, "--timeout=2s", "--protocol=tcp")
		if err != nil {
			return fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr))
		}
		return nil
	}
	eventually(t, ctx, "a reaches b", func() error { return connect(a, b.Status.PodIP+":8080") })
	eventually(t, ctx, "a reaches the Service", func() error { return connect(a, svc.Spec.ClusterIP+":80") })

	// kubectl itself, as a user would run it.
	kubectl := filepath.Join(os.Getenv("KUBE_BIN_DIR"), "kubectl")
	if out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", c.Kubeconfig, "-n", ns, "exec", a.Name, "--", "/agnhost", "connect", b.Status.PodIP+":8080", "--timeout=2s").CombinedOutput(); err != nil {
		t.Fatalf("kubectl exec: %v\n%s", err, out)
	}
	// The container's hostname is its pod's name (agnhost serve-hostname answers with it).
	out, _, err := c.Exec(ctx, ns, a.Name, "web", "/bin/sh", "-c", "cat /proc/sys/kernel/hostname")
	if err != nil || strings.TrimSpace(out) != a.Name {
		t.Fatalf("hostname in %s: %q, %v", a.Name, out, err)
	}

	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "isolate-b", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod-template-hash": b.Labels["pod-template-hash"]}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	// Both pods share the template hash: the policy isolates both, so a → b is denied.
	if _, err := c.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the policy denies a → b", func() error {
		if err := connect(a, b.Status.PodIP+":8080"); err == nil {
			return fmt.Errorf("a still reaches b")
		}
		return nil
	})
	if err := c.Client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "a reaches b again", func() error { return connect(a, b.Status.PodIP+":8080") })

	// A deleted pod is gone from the API once its node has torn it down, and its replacement runs.
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, a.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the deleted pod is replaced", func() error {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Name == a.Name {
				return fmt.Errorf("%s still there (phase %s)", a.Name, p.Status.Phase)
			}
		}
		if ready := readyPods(pods.Items); len(ready) != 2 {
			return fmt.Errorf("%d of 2 pods ready", len(ready))
		}
		return nil
	})
}

func waitReadyPods(t *testing.T, ctx context.Context, c *minicluster.Cluster, ns, selector string, n int) []corev1.Pod {
	t.Helper()
	var ready []corev1.Pod
	eventually(t, ctx, fmt.Sprintf("%d pods %s ready", n, selector), func() error {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		ready = readyPods(pods.Items)
		if len(ready) != n {
			var b bytes.Buffer
			for _, p := range pods.Items {
				fmt.Fprintf(&b, " %s on %q: %s %v;", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions)
			}
			return fmt.Errorf("%d of %d ready:%s", len(ready), n, b.String())
		}
		return nil
	})
	return ready
}

func readyPods(pods []corev1.Pod) []corev1.Pod {
	var ready []corev1.Pod
	for _, p := range pods {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				ready = append(ready, p)
			}
		}
	}
	return ready
}

// eventually retries check until it passes or ctx ends, as the upstream suites probe.
func eventually(t *testing.T, ctx context.Context, what string, check func() error) {
	t.Helper()
	var err error
	for {
		if err = check(); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
