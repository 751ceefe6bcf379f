package kubeapi_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/source/kubeapi"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
)

// TestIntegrationSource runs the Source against a real kube-apiserver: the initial sync, the
// content of snapshots, notifications for the changes that matter (and none for those that
// Transform strips), and catching up after the API server restarts.
func TestIntegrationSource(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := srv.AdminClient(t)
	began := time.Now()
	step := func(format string, args ...any) {
		t.Helper()
		t.Logf("%6.2fs "+format, append([]any{time.Since(began).Seconds()}, args...)...)
	}

	// Objects that exist before the source starts.
	must(t, kubetest.EnsureNamespace(ctx, c, "shop", map[string]string{"team": "a"}))
	must(t, kubetest.EnsureNamespace(ctx, c, "db", nil))
	_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "node-1",
			Labels:      map[string]string{"kubernetes.io/hostname": "node-1"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, PodCIDR: "10.244.1.0/24"},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "192.0.2.11"},
				{Type: corev1.NodeHostName, Address: "node-1"},
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Capacity:   corev1.ResourceList{},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	web := createPod(ctx, t, c, "shop", "web", map[string]string{"app": "web"}, "10.244.1.5", "fd00:10:244:1::5")
	createPod(ctx, t, c, "db", "pending", map[string]string{"app": "db"}) // no IP yet
	_, err = c.NetworkingV1().NetworkPolicies("shop").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-web", Namespace: "shop", Annotations: map[string]string{"note": "x"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("http"))}},
			}},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	step("created the initial objects")

	var logs syncBuffer
	src := kubeapi.New(kubernetes.NewForConfigOrDie(srv.AdminConfig()), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("source log:\n%s", logs.String())
		}
	})
	var notified atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, func() { notified.Add(1) }) }()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	}()

	poll(t, time.Minute, "initial sync", func() bool { return src.HasSynced() })
	step("synced after %d notifications", notified.Load())
	if notified.Load() == 0 {
		t.Error("no notification by the time the source synced")
	}

	// The initial snapshot holds what the API server has, stripped by Transform.
	st := src.Snapshot()
	for _, ns := range []string{"default", "kube-system", "shop", "db"} {
		if st.Namespaces[ns] == nil {
			t.Errorf("namespace %s missing from the snapshot: %v", ns, keys(st.Namespaces))
		}
	}
	if ns := st.Namespaces["shop"]; ns != nil {
		want := map[string]string{"team": "a", cluster.NamespaceNameLabel: "shop"}
		if !reflect.DeepEqual(ns.Labels, want) {
			t.Errorf("namespace shop labels %v, want %v", ns.Labels, want)
		}
		if ns.ManagedFields != nil || ns.Spec.Finalizers != nil || ns.Status.Phase != "" || ns.CreationTimestamp != (metav1.Time{}) {
			t.Errorf("namespace not stripped: %+v", ns)
		}
	}
	if st.Pods.Len() != 2 {
		t.Errorf("pods %v, want shop/web and db/pending", keys(st.Pods.Map()))
	}
	if p := st.Pods.Get("shop/web"); p == nil {
		t.Error("pod shop/web missing")
	} else {
		want := &cluster.Pod{Namespace: "shop", Name: "web", ResourceVersion: web.ResourceVersion, Labels: map[string]string{"app": "web"},
			NodeName: "node-1", Phase: corev1.PodRunning,
			IPs:   []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00:10:244:1::5")},
			Ports: []cluster.ContainerPort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}},
		}
		if !reflect.DeepEqual(p, want) {
			t.Errorf("pod %+v\nwant %+v (what the agent keeps)", p, want)
		}
	}
	if p := st.Pods.Get("db/pending"); p == nil || p.Phase != corev1.PodPending || len(p.IPs) != 0 {
		t.Errorf("pending pod: %+v", p)
	}
	if np := st.Policies["shop/allow-web"]; np == nil {
		t.Error("policy shop/allow-web missing")
	} else {
		if np.Annotations != nil || np.ManagedFields != nil || np.Generation != 0 {
			t.Errorf("policy metadata not stripped: %+v", np.ObjectMeta)
		}
		if !reflect.DeepEqual(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("policy types %v", np.Spec.PolicyTypes)
		}
		if ports := np.Spec.Ingress[0].Ports; len(ports) != 1 || ports[0].Protocol == nil || *ports[0].Protocol != corev1.ProtocolTCP ||
			*ports[0].Port != intstr.FromString("http") {
			t.Errorf("policy ports %+v", ports)
		}
	}
	if n := st.Nodes["node-1"]; n == nil {
		t.Error("node node-1 missing")
	} else {
		if !reflect.DeepEqual(n.Spec.PodCIDRs, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}) || len(n.Status.Addresses) != 2 ||
			n.Status.Addresses[0].Address != "192.0.2.11" {
			t.Errorf("node spec/status: %+v %+v", n.Spec, n.Status)
		}
		if n.Spec.PodCIDR != "" || n.Status.Conditions != nil || n.Annotations != nil || n.Labels["kubernetes.io/hostname"] != "node-1" {
			t.Errorf("node not stripped: %+v", n)
		}
	}

	// Each change below must reach the snapshot and notify.
	// The timeout is generous for the informers' backoff after the API server restart, which may take
	// a while on a loaded machine.
	change := func(what string, do func(), cond func(*cluster.State) bool) {
		t.Helper()
		before := notified.Load()
		do()
		poll(t, time.Minute, what, func() bool { return notified.Load() > before && cond(src.Snapshot()) })
		step("%s: seen", what)
	}

	change("pod label change", func() {
		p, err := c.CoreV1().Pods("shop").Get(ctx, "web", metav1.GetOptions{})
		must(t, err)
		p.Labels["tier"] = "front"
		_, err = c.CoreV1().Pods("shop").Update(ctx, p, metav1.UpdateOptions{})
		must(t, err)
	}, func(st *cluster.State) bool {
		p := st.Pods.Get("shop/web")
		return p != nil && p.Labels["tier"] == "front"
	})

	change("pod gets its IP", func() {
		_, err := kubetest.SetPodRunning(ctx, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "pending"}}, "10.244.1.9")
		must(t, err)
	}, func(st *cluster.State) bool {
		p := st.Pods.Get("db/pending")
		return p != nil && p.Phase == corev1.PodRunning && slices.Equal(p.IPs, []netip.Addr{netip.MustParseAddr("10.244.1.9")})
	})

	change("policy update", func() {
		np, err := c.NetworkingV1().NetworkPolicies("shop").Get(ctx, "allow-web", metav1.GetOptions{})
		must(t, err)
		udp := corev1.ProtocolUDP
		np.Spec.Ingress[0].Ports = append(np.Spec.Ingress[0].Ports, networkingv1.NetworkPolicyPort{Protocol: &udp, Port: ptr(intstr.FromInt32(53))})
		_, err = c.NetworkingV1().NetworkPolicies("shop").Update(ctx, np, metav1.UpdateOptions{})
		must(t, err)
	}, func(st *cluster.State) bool {
		np := st.Policies["shop/allow-web"]
		return np != nil && len(np.Spec.Ingress[0].Ports) == 2
	})

	change("namespace relabel", func() {
		ns, err := c.CoreV1().Namespaces().Get(ctx, "db", metav1.GetOptions{})
		must(t, err)
		ns.Labels["team"] = "a"
		_, err = c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		must(t, err)
	}, func(st *cluster.State) bool {
		ns := st.Namespaces["db"]
		return ns != nil && ns.Labels["team"] == "a"
	})

	change("node address update", func() {
		n, err := c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		must(t, err)
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "2001:db8::11"})
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		must(t, err)
	}, func(st *cluster.State) bool {
		n := st.Nodes["node-1"]
		return n != nil && len(n.Status.Addresses) == 3
	})

	change("pod deletion", func() {
		_, err := kubetest.DeletePodNow(ctx, c, "shop", "web")
		must(t, err)
	}, func(st *cluster.State) bool { return st.Pods.Get("shop/web") == nil })

	// Updates of fields that Transform drops change no object: the snapshot after them lists no
	// changed key and keeps every object. Their resourceVersions still reach the snapshot's
	// Revision (with a notification), so that whoever made them can see them taken in.
	stBefore := src.Snapshot()
	p, err := c.CoreV1().Pods("db").Get(ctx, "pending", metav1.GetOptions{})
	must(t, err)
	p.Annotations = map[string]string{"checked": "yes"}
	p, err = c.CoreV1().Pods("db").Update(ctx, p, metav1.UpdateOptions{})
	must(t, err)
	n, err := c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	must(t, err)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), Reason: "heartbeat"}}
	n, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	must(t, err)
	podRV, nodeRV := cluster.ParseResourceVersion(p.ResourceVersion), cluster.ParseResourceVersion(n.ResourceVersion)
	var stAfter *cluster.State
	poll(t, time.Minute, "annotation and heartbeat updates in the Revision", func() bool {
		stAfter = src.Snapshot()
		return stAfter.Revision.Covers("pods", podRV) && stAfter.Revision.Covers("nodes", nodeRV)
	})
	if ch := stAfter.Changes; ch == nil || ch.Since == 0 {
		t.Errorf("the snapshot after stripped-field updates has no Changes: %+v", ch)
	} else if len(ch.Pods)+len(ch.Nodes)+len(ch.Namespaces)+len(ch.Policies) != 0 {
		t.Errorf("updates of stripped fields only listed changed keys: %+v", ch)
	}
	if stAfter.Pods.Get("db/pending") != stBefore.Pods.Get("db/pending") || stAfter.Nodes["node-1"] != stBefore.Nodes["node-1"] {
		t.Error("updates of stripped fields only replaced the objects")
	}
	step("stripped-field updates: no object changed, Revision moved")

	// The pods no policy judges are never sent (PodFieldSelector): one of the node's network,
	// and one that finishes, which leaves the snapshot when it does.
	change("a job pod starts, and a pod of the node's network", func() {
		createPod(ctx, t, c, "shop", "job", map[string]string{"app": "job"}, "10.244.1.9")
		host, err := c.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "host", Namespace: "shop", Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: "node-1", HostNetwork: true,
				Containers: []corev1.Container{{Name: "main", Image: "registry.example/agent:1"}}},
		}, metav1.CreateOptions{})
		must(t, err)
		_, err = kubetest.SetPodRunning(ctx, c, host, "192.0.2.11")
		must(t, err)
	}, func(st *cluster.State) bool { return st.Pods.Get("shop/job") != nil })
	if st := src.Snapshot(); st.Pods.Get("shop/host") != nil {
		t.Error("the pod of the node's network is in the snapshot")
	}
	change("the job pod finishes", func() {
		job, err := c.CoreV1().Pods("shop").Get(ctx, "job", metav1.GetOptions{})
		must(t, err)
		job.Status.Phase = corev1.PodSucceeded
		_, err = c.CoreV1().Pods("shop").UpdateStatus(ctx, job, metav1.UpdateOptions{})
		must(t, err)
	}, func(st *cluster.State) bool { return st.Pods.Get("shop/job") == nil })

	// The API server restarts; the source catches up with the changes made after it is back.
	srv.Restart(t)
	step("API server restarted (startup %v)", srv.StartupTime.Round(time.Millisecond))
	change("changes after the restart", func() {
		createPod(ctx, t, c, "shop", "api", map[string]string{"app": "api"}, "10.244.1.7")
		must(t, c.NetworkingV1().NetworkPolicies("shop").Delete(ctx, "allow-web", metav1.DeleteOptions{}))
		ns, err := c.CoreV1().Namespaces().Get(ctx, "shop", metav1.GetOptions{})
		must(t, err)
		ns.Labels["team"] = "b"
		_, err = c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		must(t, err)
		must(t, c.CoreV1().Nodes().Delete(ctx, "node-1", metav1.DeleteOptions{}))
	}, func(st *cluster.State) bool {
		api := st.Pods.Get("shop/api")
		return api != nil && slices.Equal(api.IPs, []netip.Addr{netip.MustParseAddr("10.244.1.7")}) &&
			st.Policies["shop/allow-web"] == nil && st.Namespaces["shop"].Labels["team"] == "b" && st.Nodes["node-1"] == nil
	})
	if !src.HasSynced() {
		t.Error("HasSynced false after the restart")
	}
	st = src.Snapshot()
	if st.Pods.Len() != 2 || st.Pods.Get("db/pending") == nil || len(st.Policies) != 0 || len(st.Nodes) != 0 {
		t.Errorf("final snapshot: pods %v, policies %v, nodes %v", keys(st.Pods.Map()), keys(st.Policies), keys(st.Nodes))
	}
}

// createPod creates a pod bound to node-1 with two container ports (one left for the API server to
// default to TCP) and, when ips are given, sets it running with them.
func createPod(ctx context.Context, t *testing.T, c kubernetes.Interface, namespace, name string, labels map[string]string, ips ...string) *corev1.Pod {
	t.Helper()
	pod, err := c.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Containers: []corev1.Container{
				{Name: "main", Image: "registry.example/app:1", Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080},
					{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
				}},
				{Name: "sidecar", Image: "registry.example/sidecar:1"},
			},
		},
	}, metav1.CreateOptions{})
	must(t, err)
	if len(ips) == 0 {
		return pod
	}
	pod, err = kubetest.SetPodRunning(ctx, c, pod, ips...)
	must(t, err)
	return pod
}

func poll(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
