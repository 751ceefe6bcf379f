package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

func kubectlBinary(t testing.TB) string {
	t.Helper()
	return kubetest.Binary(t, "kubectl")
}

func startKube(t *testing.T) *kubetest.Server {
	t.Helper()
	return kubetest.Start(t, kubetest.Options{})
}

// runKubectl runs kubectl with the kubeconfig and its own empty HOME and cache directory (no
// user preferences or cached discovery leak in) and returns its output; a failure fails the test.
func runKubectl(t testing.TB, kubectl, kubeconfig string, args ...string) string {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(home, "cache")}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBECONFIG=") && !strings.HasPrefix(kv, "HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// appliedNames are the objects of deploy/ as kubectl names them in its output.
func appliedNames(m *manifests) []string {
	return []string{
		"customresourcedefinition.apiextensions.k8s.io/" + m.crd.name,
		"serviceaccount/" + m.serviceAccount.Name,
		"clusterrole.rbac.authorization.k8s.io/" + m.clusterRole.Name,
		"clusterrolebinding.rbac.authorization.k8s.io/" + m.binding.Name,
		"configmap/" + m.masqConfig.Name,
		"daemonset.apps/" + m.daemonSet.Name,
	}
}

// TestServerDryRun sends deploy/ to a real kube-apiserver with `kubectl apply --dry-run=server`:
// every object passes defaulting, validation (strict: no unknown fields) and admission, and nothing
// is stored.
func TestServerDryRun(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)
	kubectl := kubectlBinary(t)
	srv := startKube(t)

	out := runKubectl(t, kubectl, srv.Kubeconfig(t, ""), "apply", "--dry-run=server", "--validate=strict", "-f", m.dir)
	t.Logf("kubectl apply --dry-run=server -f deploy/:\n%s", out)
	for _, name := range appliedNames(m) {
		if !strings.Contains(out, name+" created (server dry run)") {
			t.Errorf("kubectl did not report %s created (server dry run)", name)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := srv.AdminClient(t).AppsV1().DaemonSets(m.daemonSet.Namespace).Get(ctx, m.daemonSet.Name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("after a dry run, getting the DaemonSet returned %v, want NotFound", err)
	}
}

// TestAgentLeastPrivilege installs deploy/ with kubectl, then runs the real agent in a test-bed
// node with a token of the manifests' service account, so with exactly the rights they grant and
// the DaemonSet's own arguments and NODE_NAME: it must sync, and the policy must hold for packets.
// The token must also be refused everything the ClusterRole does not grant.
func TestAgentLeastPrivilege(t *testing.T) {
	requireKernel(t)
	m := loadManifests(t)
	kubectl := kubectlBinary(t)
	srv := startKube(t)
	admin := srv.AdminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	out := runKubectl(t, kubectl, srv.Kubeconfig(t, ""), "apply", "-f", m.dir)
	t.Logf("kubectl apply -f deploy/:\n%s", out)
	for _, name := range appliedNames(m) {
		if !strings.Contains(out, name+" created") {
			t.Errorf("kubectl did not report %s created", name)
		}
	}

	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{Topology: testbed.Routed, IPv4: true}})
	if err != nil {
		t.Fatalf("creating test bed: %v", err)
	}
	var agentLog string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent output:\n%s", agentLog)
			if table, err := sim.Nft("list", "table", "inet", "netwarden"); err == nil {
				t.Logf("kernel table:\n%s", table)
			}
		}
		if err := sim.Close(); err != nil {
			t.Errorf("closing test bed: %v", err)
		}
	})

	// A namespace and two pods on the test bed's node, as a kubelet would report them.
	const ns = "x"
	if err := kubetest.EnsureNamespace(ctx, admin, ns, map[string]string{"team": "x"}); err != nil {
		t.Fatal(err)
	}
	tpods := map[string]*testbed.Pod{}
	for _, name := range []string{"a", "b"} {
		tp, err := sim.Bed.AddPod(ns, name)
		if err != nil {
			t.Fatal(err)
		}
		tpods[name] = tp
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: sim.NodeName, Containers: []corev1.Container{{Name: "main", Image: "example.invalid/server",
				Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}},
		}
		created, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kubetest.SetPodRunning(ctx, admin, created, tp.IPv4.String()); err != nil {
			t.Fatal(err)
		}
	}
	probe := func(from, to string) bool {
		return sim.Bed.Probe(ctx, testbed.Probe{Src: tpods[from], Dst: tpods[to].IPv4, Port: 80, Protocol: testbed.TCP})
	}
	if !probe("b", "a") || !probe("a", "b") {
		t.Fatal("pods cannot reach each other before any policy")
	}

	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deny-ingress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := admin.NetworkingV1().NetworkPolicies(ns).Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A ClusterNetworkPolicy (the CRD came with deploy/) that selects none of the test's pods.
	cnp, err := npaclient.NewForConfigOrDie(srv.AdminConfig()).PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 10,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "nobody"}}},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The service account the DaemonSet runs as, bound by deploy/ and nothing else.
	sa := m.serviceAccount
	token := srv.CreateServiceAccountToken(t, sa.Namespace, sa.Name)
	saClient, err := kubernetes.NewForConfig(srv.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := kubernetes.NewForConfig(srv.Config(srv.CreateServiceAccountToken(t, sa.Namespace, "netwarden-test-nobody")))
	if err != nil {
		t.Fatal(err)
	}
	checkRights(ctx, t, saClient, nobody, npaclient.NewForConfigOrDie(srv.Config(token)), ns, cnp.Name)

	// The agent as the DaemonSet runs it (its args, NODE_NAME from the downward API), with the
	// kubeconfig in place of the in-cluster configuration, once.
	if err := sim.ForwardFromNode(strings.TrimPrefix(srv.URL, "https://")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", sim.NodeName)
	args := append(slices.Clone(m.agentContainer(t).Args), "--once", "--kubeconfig", srv.Kubeconfig(t, token), "--log-level", "debug")
	runCtx, runCancel := context.WithTimeout(ctx, 90*time.Second)
	defer runCancel()
	began := time.Now()
	agentLog, err = sim.RunAgent(runCtx, args...)
	if err != nil {
		t.Fatalf("netwarden %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("agent --once with the service account's token synced in %v", time.Since(began).Round(time.Millisecond))
	if strings.Contains(strings.ToLower(agentLog), "forbidden") {
		t.Errorf("the agent was refused something:\n%s", agentLog)
	}

	if probe("b", "a") {
		t.Error("b reached a, which deny-ingress isolates")
	}
	if !probe("a", "b") {
		t.Error("a cannot reach b, which no policy selects")
	}
}

// checkRights checks that client (the agent's service account) can read what the agent watches,
// and write the ClusterNetworkPolicy status, and nothing more. First the API server's own account
// of the rules that apply in ns (cluster-wide ones included): beyond what every service account
// gets by default (baseline, an account with no bindings of its own: asking about its own rights,
// reading ClusterTrustBundles, ...) they must be exactly get, list and watch on the five kinds and
// patch on clusternetworkpolicies/status. Then real requests (npa is client's ClusterNetworkPolicy
// client; the policy cnp exists).
func checkRights(ctx context.Context, t *testing.T, client, baseline kubernetes.Interface, npa npaclient.Interface, ns, cnp string) {
	t.Helper()
	granted, base := resourceRules(ctx, t, client, ns), resourceRules(ctx, t, baseline, ns)
	want := map[string]bool{}
	for g, resources := range wantRules {
		for _, res := range resources {
			for _, v := range wantVerbs(res) {
				want[g+"/"+res+":"+v] = true
			}
		}
	}
	for r := range granted {
		if !want[r] && !base[r] {
			t.Errorf("the service account may do more than the ClusterRole's reads: %s", r)
		}
	}
	for r := range want {
		if !granted[r] {
			t.Errorf("the service account may not %s", r)
		}
	}
	t.Logf("rules every service account has (not checked): %v", sortedKeys(base))

	// Allowed: get, list and watch of the five kinds, and the ClusterNetworkPolicy status.
	listOpts := metav1.ListOptions{Limit: 1}
	cnps := npa.PolicyV1beta1().ClusterNetworkPolicies()
	allowed := map[string]func() error{
		"list pods (all namespaces)": func() error { _, err := client.CoreV1().Pods("").List(ctx, listOpts); return err },
		"get pod":                    func() error { _, err := client.CoreV1().Pods(ns).Get(ctx, "a", metav1.GetOptions{}); return err },
		"watch pods":                 func() error { return watch(client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{})) },
		"list namespaces":            func() error { _, err := client.CoreV1().Namespaces().List(ctx, listOpts); return err },
		"get namespace":              func() error { _, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); return err },
		"watch namespaces":           func() error { return watch(client.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{})) },
		"list nodes":                 func() error { _, err := client.CoreV1().Nodes().List(ctx, listOpts); return err },
		"watch nodes":                func() error { return watch(client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})) },
		"list networkpolicies":       func() error { _, err := client.NetworkingV1().NetworkPolicies("").List(ctx, listOpts); return err },
		"get networkpolicy": func() error {
			_, err := client.NetworkingV1().NetworkPolicies(ns).Get(ctx, "deny-ingress", metav1.GetOptions{})
			return err
		},
		"watch networkpolicies": func() error {
			return watch(client.NetworkingV1().NetworkPolicies("").Watch(ctx, metav1.ListOptions{}))
		},
		"list clusternetworkpolicies": func() error { _, err := cnps.List(ctx, listOpts); return err },
		"get clusternetworkpolicy":    func() error { _, err := cnps.Get(ctx, cnp, metav1.GetOptions{}); return err },
		"watch clusternetworkpolicies": func() error {
			return watch(cnps.Watch(ctx, metav1.ListOptions{}))
		},
		"patch a clusternetworkpolicy's status": func() error {
			_, err := cnps.Patch(ctx, cnp, types.MergePatchType,
				[]byte(`{"status":{"conditions":[{"type":"netwarden.io/RightsCheck","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`),
				metav1.PatchOptions{}, "status")
			return err
		},
	}
	for what, do := range allowed {
		if err := do(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}

	// Forbidden: everything else, reads and writes.
	patch := []byte(`{"metadata":{"labels":{"netwarden-test":"x"}}}`)
	forbidden := map[string]func() error{
		"list secrets in kube-system": func() error { _, err := client.CoreV1().Secrets("kube-system").List(ctx, listOpts); return err },
		"list secrets (all namespaces)": func() error {
			_, err := client.CoreV1().Secrets("").List(ctx, listOpts)
			return err
		},
		"get the masquerade ConfigMap": func() error {
			_, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, "netwarden-masq", metav1.GetOptions{})
			return err
		},
		"list services":       func() error { _, err := client.CoreV1().Services("").List(ctx, listOpts); return err },
		"list endpointslices": func() error { _, err := client.DiscoveryV1().EndpointSlices("").List(ctx, listOpts); return err },
		"list serviceaccounts": func() error {
			_, err := client.CoreV1().ServiceAccounts("kube-system").List(ctx, listOpts)
			return err
		},
		"create a pod": func() error {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "intruder"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/x"}}}}
			_, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
		"label a pod": func() error {
			_, err := client.CoreV1().Pods(ns).Patch(ctx, "a", types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		},
		"delete a pod": func() error { return client.CoreV1().Pods(ns).Delete(ctx, "b", metav1.DeleteOptions{}) },
		"label a namespace": func() error {
			_, err := client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		},
		"create a node": func() error {
			_, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{})
			return err
		},
		"delete the network policy": func() error {
			return client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, "deny-ingress", metav1.DeleteOptions{})
		},
		"create a network policy": func() error {
			np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-all"}}
			_, err := client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{})
			return err
		},
		"create an event": func() error {
			ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "netwarden-test"},
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "a"}, Reason: "Test", Message: "test"}
			_, err := client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
			return err
		},
		"create a cluster network policy": func() error {
			_, err := cnps.Create(ctx, &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "intruder"},
				Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier,
					Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}}}, metav1.CreateOptions{})
			return err
		},
		"change a cluster network policy": func() error {
			_, err := cnps.Patch(ctx, cnp, types.MergePatchType, []byte(`{"spec":{"priority":999}}`), metav1.PatchOptions{})
			return err
		},
		"delete a cluster network policy": func() error { return cnps.Delete(ctx, cnp, metav1.DeleteOptions{}) },
		"edit its own ClusterRole": func() error {
			_, err := client.RbacV1().ClusterRoles().Patch(ctx, "netwarden", types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		},
	}
	for what, do := range forbidden {
		if err := do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: got %v, want Forbidden", what, err)
		}
	}
}

// resourceRules asks the API server which resource rules apply to client's user in ns, as
// "group/resource:verb" (with "[names]" when limited to resource names).
func resourceRules(ctx context.Context, t *testing.T, client kubernetes.Interface, ns string) map[string]bool {
	t.Helper()
	review, err := client.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectRulesReview: %v", err)
	}
	if review.Status.Incomplete {
		t.Logf("SelfSubjectRulesReview is incomplete: %s", review.Status.EvaluationError)
	}
	rules := map[string]bool{}
	for _, r := range review.Status.ResourceRules {
		names := ""
		if len(r.ResourceNames) > 0 {
			names = fmt.Sprintf("%v", r.ResourceNames)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					rules[g+"/"+res+names+":"+v] = true
				}
			}
		}
	}
	return rules
}

// watch stops a watch that opened, or returns why it did not.
func watch(w interface{ Stop() }, err error) error {
	if err != nil {
		return err
	}
	w.Stop()
	return nil
}

// requireKernel skips the test (or fails it when $CI is set) unless it can create network
// namespaces, program nftables and run the agent binary.
func requireKernel(t *testing.T) { kerneltest.RequireAgent(t, simnode.AgentBinary) }
