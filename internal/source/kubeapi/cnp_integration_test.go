package kubeapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/source/kubeapi"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
)

// requestCounter counts the requests a client makes, by what they ask.
type requestCounter struct {
	mu sync.Mutex
	// discovery: GETs of the ClusterNetworkPolicy group version; patched: status patches
	// that succeeded.
	discovery, patched int
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case req.Method == http.MethodGet && req.URL.Path == "/apis/"+kubeapi.ClusterPolicyGroupVersion:
			c.discovery++
		case req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/status") && err == nil && resp.StatusCode == http.StatusOK:
			c.patched++
		}
		return resp, err
	})
}

func (c *requestCounter) get() (discovery, patched int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.discovery, c.patched
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// agentSource is a Source as the agent runs it, with its log and the requests it makes.
type agentSource struct {
	src      *kubeapi.Source
	logs     *syncBuffer
	requests *requestCounter
	notified atomic.Int64
}

func startAgentSource(ctx context.Context, t *testing.T, cfg *rest.Config, name string) *agentSource {
	t.Helper()
	a := &agentSource{logs: &syncBuffer{}, requests: &requestCounter{}}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(a.requests.wrap)
	a.src = kubeapi.New(kubernetes.NewForConfigOrDie(cfg), slog.New(slog.NewTextHandler(a.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		kubeapi.WithClusterNetworkPolicies(npaclient.NewForConfigOrDie(cfg)), kubeapi.WithCRDPollInterval(100*time.Millisecond),
		kubeapi.WithClusterPolicyStatus())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.src.Run(runCtx, func() { a.notified.Add(1) }) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: Run did not return after cancel", name)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, a.logs.String())
		}
	})
	return a
}

// waitCovers waits until the source's snapshot covers the write of resource at rv, and returns it.
func (a *agentSource) waitCovers(t *testing.T, resource string, rv string) *cluster.State {
	t.Helper()
	want := cluster.ParseResourceVersion(rv)
	var st *cluster.State
	poll(t, time.Minute, resource+" at resourceVersion "+rv, func() bool {
		st = a.src.Snapshot()
		return st.Revision.Covers(resource, want)
	})
	return st
}

// TestIntegrationClusterNetworkPolicies runs two agents' Sources against a real kube-apiserver on
// which the ClusterNetworkPolicy CRD is missing at first: they sync and deliver NetworkPolicies;
// then the CRD is installed and ClusterNetworkPolicies are created, updated and deleted; the
// agents write one Accepted condition between them; then the CRD is deleted and the policies go.
// A Source started while the CRD is served has its policies when it counts as synced, and one
// not allowed to write the status does not.
func TestIntegrationClusterNetworkPolicies(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := srv.AdminClient(t)
	npa := npaclient.NewForConfigOrDie(srv.AdminConfig()).PolicyV1beta1().ClusterNetworkPolicies()
	must(t, kubetest.EnsureNamespace(ctx, c, "shop", nil))
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny", Namespace: "shop"}}
	_, err := c.NetworkingV1().NetworkPolicies("shop").Create(ctx, np, metav1.CreateOptions{})
	must(t, err)

	a := startAgentSource(ctx, t, srv.AdminConfig(), "agent a")
	b := startAgentSource(ctx, t, srv.AdminConfig(), "agent b")
	const absent = "ClusterNetworkPolicy CRD not installed"
	for _, ag := range []*agentSource{a, b} {
		poll(t, time.Minute, "sync without the CRD", ag.src.HasSynced)
		if st := ag.src.Snapshot(); st.Policies["shop/deny"] == nil || len(st.ClusterPolicies) != 0 {
			t.Fatalf("snapshot at sync: policies %v, cluster policies %v", keys(st.Policies), keys(st.ClusterPolicies))
		}
		// Discovery asked a few more times: the absence is still logged once.
		n, _ := ag.requests.get()
		poll(t, time.Minute, "more discovery requests", func() bool { m, _ := ag.requests.get(); return m >= n+3 })
		if got := strings.Count(ag.logs.String(), absent); got != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", absent, got, ag.logs.String())
		}
	}
	// NetworkPolicies keep coming.
	np2, err := c.NetworkingV1().NetworkPolicies("shop").Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "second", Namespace: "shop"}}, metav1.CreateOptions{})
	must(t, err)
	if st := a.waitCovers(t, "networkpolicies", np2.ResourceVersion); st.Policies["shop/second"] == nil {
		t.Error("a NetworkPolicy created while the CRD is missing is not in the snapshot")
	}

	srv.InstallClusterNetworkPolicyCRD(t, kubetest.CRDStandard)
	cnp, err := npa.Create(ctx, &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "no-metadata", Annotations: map[string]string{"note": "dropped"}},
		Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier: npav1beta1.AdminTier, Priority: 10,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"169.254.169.254/32"}}}}},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	for _, ag := range []*agentSource{a, b} {
		st := ag.waitCovers(t, kubeapi.ClusterPolicyResource, cnp.ResourceVersion)
		got := st.ClusterPolicies["no-metadata"]
		if got == nil {
			t.Fatalf("the policy created once the CRD is served is not in the snapshot: %v", keys(st.ClusterPolicies))
		}
		if got.Spec.Priority != 10 || got.Spec.Egress[0].To[0].Networks[0] != "169.254.169.254/32" || got.Annotations != nil || got.ManagedFields != nil {
			t.Errorf("policy in the snapshot: %+v", got)
		}
		if !strings.Contains(ag.logs.String(), "writing the netwarden.io/Accepted condition") {
			t.Error("the status RBAC check's result is not logged")
		}
	}

	// The condition: written once between the two agents, for the current generation.
	waitCondition := func(name string, gen int64, status metav1.ConditionStatus) *npav1beta1.ClusterNetworkPolicy {
		t.Helper()
		var got *npav1beta1.ClusterNetworkPolicy
		poll(t, time.Minute, "condition of "+name, func() bool {
			var err error
			got, err = npa.Get(ctx, name, metav1.GetOptions{})
			must(t, err)
			c := meta.FindStatusCondition(got.Status.Conditions, kubeapi.ConditionAccepted)
			return c != nil && c.Status == status && c.ObservedGeneration == gen
		})
		return got
	}
	patches := func() int { _, pa := a.requests.get(); _, pb := b.requests.get(); return pa + pb }
	got := waitCondition("no-metadata", cnp.Generation, metav1.ConditionTrue)
	if c := meta.FindStatusCondition(got.Status.Conditions, kubeapi.ConditionAccepted); c.Reason != kubeapi.ReasonValid {
		t.Errorf("condition %+v", c)
	}
	quiet := func() (int64, int64) {
		t.Helper()
		a.waitCovers(t, kubeapi.ClusterPolicyResource, got.ResourceVersion)
		b.waitCovers(t, kubeapi.ClusterPolicyResource, got.ResourceVersion)
		var na, nb int64
		poll(t, time.Minute, "the condition writers idle", func() bool {
			var ia, ib bool
			na, ia = a.src.StatusSyncs()
			nb, ib = b.src.StatusSyncs()
			return ia && ib
		})
		return na, nb
	}
	na, nb := quiet()
	if n := patches(); n != 1 {
		t.Errorf("the two agents patched the status %d times, want once", n)
	}
	// A change that leaves the condition right (a label) is looked at and written by none.
	got.Labels = map[string]string{"owner": "sec"}
	got, err = npa.Update(ctx, got, metav1.UpdateOptions{})
	must(t, err)
	a.waitCovers(t, kubeapi.ClusterPolicyResource, got.ResourceVersion)
	b.waitCovers(t, kubeapi.ClusterPolicyResource, got.ResourceVersion)
	poll(t, time.Minute, "the label change looked at", func() bool {
		ma, ia := a.src.StatusSyncs()
		mb, ib := b.src.StatusSyncs()
		return ma > na && mb > nb && ia && ib
	})
	if n := patches(); n != 1 {
		t.Errorf("a label change made the agents patch the status (%d patches in all)", n)
	}

	// Priority updated: the snapshot has it, and the condition follows the generation.
	got.Spec.Priority = 20
	got, err = npa.Update(ctx, got, metav1.UpdateOptions{})
	must(t, err)
	for _, ag := range []*agentSource{a, b} {
		st := ag.waitCovers(t, kubeapi.ClusterPolicyResource, got.ResourceVersion)
		if p := st.ClusterPolicies["no-metadata"]; p == nil || p.Spec.Priority != 20 {
			t.Fatalf("updated priority not in the snapshot: %+v", p)
		}
		if ch := st.Changes; ch == nil || len(ch.Policies)+len(ch.Pods)+len(ch.Namespaces)+len(ch.Nodes) != 0 {
			t.Errorf("changes of the priority update: %+v", ch)
		}
	}
	got = waitCondition("no-metadata", got.Generation, metav1.ConditionTrue)
	quiet()
	if n := patches(); n != 2 {
		t.Errorf("%d status patches after a new generation, want 2 in all", n)
	}

	// A policy the CRD lets through but the agents cannot read (a selector that does not
	// parse) is left out, and its condition says why; the others stay.
	bad, err := npa.Create(ctx, &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bad-selector"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier: npav1beta1.BaselineTier, Priority: 1,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Has"}}}},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}}},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	for _, ag := range []*agentSource{a, b} {
		st := ag.waitCovers(t, kubeapi.ClusterPolicyResource, bad.ResourceVersion)
		if st.ClusterPolicies["bad-selector"] != nil || st.ClusterPolicies["no-metadata"] == nil {
			t.Errorf("cluster policies %v, want no-metadata only", keys(st.ClusterPolicies))
		}
		if !strings.Contains(ag.logs.String(), `ClusterNetworkPolicy \"bad-selector\": spec.subject.namespaces.matchExpressions[0]: Invalid value: \"team Has []\"`) {
			t.Errorf("the invalid policy is not logged with its name and field")
		}
	}
	gotBad := waitCondition("bad-selector", bad.Generation, metav1.ConditionFalse)
	if c := meta.FindStatusCondition(gotBad.Status.Conditions, kubeapi.ConditionAccepted); c.Reason != kubeapi.ReasonInvalid ||
		!strings.HasPrefix(c.Message, `ClusterNetworkPolicy "bad-selector": spec.subject.namespaces.matchExpressions[0]: Invalid value: "team Has []": "Has" is not a valid label selector operator`) {
		t.Errorf("condition of the invalid policy: %+v", c)
	}

	// Deleted: gone from the snapshot once it covers the delete.
	rv, err := kubetest.DeleteNow(ctx, npaclient.NewForConfigOrDie(srv.AdminConfig()).PolicyV1beta1().RESTClient(), kubeapi.ClusterPolicyResource, "", "bad-selector")
	must(t, err)
	for _, ag := range []*agentSource{a, b} {
		ag.waitCovers(t, kubeapi.ClusterPolicyResource, strconv.FormatUint(rv, 10))
	}
	rv, err = kubetest.DeleteNow(ctx, npaclient.NewForConfigOrDie(srv.AdminConfig()).PolicyV1beta1().RESTClient(), kubeapi.ClusterPolicyResource, "", "no-metadata")
	must(t, err)
	for _, ag := range []*agentSource{a, b} {
		if st := ag.waitCovers(t, kubeapi.ClusterPolicyResource, strconv.FormatUint(rv, 10)); len(st.ClusterPolicies) != 0 {
			t.Errorf("cluster policies after the deletes: %v", keys(st.ClusterPolicies))
		}
	}

	// The CRD goes away: so do its policies, and everything else stays.
	_, err = npa.Create(ctx, &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "last"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.BaselineTier,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}},
	}, metav1.CreateOptions{})
	must(t, err)
	poll(t, time.Minute, "the last policy", func() bool { return a.src.Snapshot().ClusterPolicies["last"] != nil })
	srv.DeleteCRD(t, kubetest.ClusterNetworkPolicyCRDName)
	for _, ag := range []*agentSource{a, b} {
		poll(t, time.Minute, "the policies gone with the CRD", func() bool {
			st := ag.src.Snapshot()
			return len(st.ClusterPolicies) == 0 && strings.Count(ag.logs.String(), absent) == 2
		})
		if st := ag.src.Snapshot(); st.Policies["shop/deny"] == nil || !ag.src.HasSynced() {
			t.Errorf("after the CRD went away: policies %v, synced %v", keys(st.Policies), ag.src.HasSynced())
		}
	}

	// A Source started while the CRD is served has its policies once synced. This one may read
	// but not write the status: it says so and writes nothing.
	srv.InstallClusterNetworkPolicyCRD(t, kubetest.CRDStandard)
	_, err = npa.Create(ctx, &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "there-before"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{}}},
	}, metav1.CreateOptions{})
	must(t, err)
	reader := readOnlyConfig(ctx, t, srv, c)
	r := startAgentSource(ctx, t, reader, "read-only agent")
	poll(t, time.Minute, "sync with the CRD served", r.src.HasSynced)
	if st := r.src.Snapshot(); st.ClusterPolicies["there-before"] == nil {
		t.Errorf("synced without the existing policy: %v", keys(st.ClusterPolicies))
	}
	if !strings.Contains(r.logs.String(), "not allowed to patch clusternetworkpolicies/status") {
		t.Error("the refused status RBAC check is not logged")
	}
	if _, n := r.requests.get(); n != 0 {
		t.Errorf("the read-only agent patched %d times", n)
	}
}

// readOnlyConfig returns a client configuration of a service account that may read what the
// agent reads, ClusterNetworkPolicies included, and write nothing.
func readOnlyConfig(ctx context.Context, t *testing.T, srv *kubetest.Server, c kubernetes.Interface) *rest.Config {
	t.Helper()
	token := srv.CreateServiceAccountToken(t, "kube-system", "reader")
	_, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{npav1beta1.GroupName}, Resources: []string{"clusternetworkpolicies"}, Verbs: []string{"get", "list", "watch"}},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "reader"}},
	}, metav1.CreateOptions{})
	must(t, err)
	cfg := srv.Config(token)
	sa := npaclient.NewForConfigOrDie(cfg).PolicyV1beta1().ClusterNetworkPolicies()
	// RBAC reads bindings through an informer: wait until the binding is in effect.
	poll(t, time.Minute, "the reader's binding in effect", func() bool {
		_, err := sa.List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil
	})
	return cfg
}
