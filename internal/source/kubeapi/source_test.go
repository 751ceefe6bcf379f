package kubeapi

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/netwarden/netwarden/internal/cluster"
)

// unreachable returns a client for an address where nothing listens. The tests below fill the
// informer caches directly; behaviour against an API server is tested elsewhere.
func unreachable(t *testing.T) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
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

func add(t *testing.T, s *Source, resource string, obj any) any {
	t.Helper()
	obj, err := Transform(obj)
	if err != nil {
		t.Fatal(err)
	}
	if resource == "pods" {
		if err := s.pods.Add(obj); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	for _, ni := range s.informers {
		if ni.resource == resource {
			ni.events.upsert(obj)
			return obj
		}
	}
	t.Fatalf("no informer for %s", resource)
	return nil
}

// TestSnapshot feeds objects to the event handlers as the informers would.
func TestSnapshot(t *testing.T) {
	var logs syncBuffer
	s := New(unreachable(t), slog.New(slog.NewTextHandler(&logs, nil)))
	if s.HasSynced() {
		t.Error("synced before Run")
	}
	if st := s.Snapshot(); st.Pods.Len()+len(st.Namespaces)+len(st.Policies)+len(st.Nodes) != 0 {
		t.Errorf("non-empty snapshot: %+v", st)
	}

	ns := add(t, s, "namespaces", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}).(*corev1.Namespace)
	pod := add(t, s, "pods", fullPod()).(*cluster.Pod)
	node := add(t, s, "nodes", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}}).(*corev1.Node)
	np := add(t, s, "networkpolicies", &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}}).(*networkingv1.NetworkPolicy)
	// Invalid despite coming from the "API": two IPv4 pod IPs.
	add(t, s, "pods", &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "shop"},
		Status:     corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "10.0.0.2"}}},
	})

	st := s.Snapshot()
	if st.Namespaces["shop"] != ns || st.Pods.Get("shop/web-abc-xyz") != pod || st.Nodes["node-1"] != node || st.Policies["shop/p"] != np {
		t.Errorf("snapshot does not hold the cached objects: %+v", st)
	}
	if st.Pods.Len() != 1 {
		t.Errorf("pods: %v", st.Pods)
	}
	if got := st.Namespaces["shop"].Labels[cluster.NamespaceNameLabel]; got != "shop" {
		t.Errorf("namespace not defaulted: %v", st.Namespaces["shop"].Labels)
	}
	if got := st.Policies["shop/p"].Spec.PolicyTypes; len(got) != 1 || got[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("policy not defaulted: %v", got)
	}
	if n := strings.Count(logs.String(), "ignoring invalid object"); n != 1 || !strings.Contains(logs.String(), "key=shop/bad") ||
		!strings.Contains(logs.String(), "status.podIPs[1].ip") {
		t.Errorf("log:\n%s", logs.String())
	}

	// The invalid object is logged only once; a fixed version is taken.
	s.Snapshot()
	if n := strings.Count(logs.String(), "ignoring invalid object"); n != 1 {
		t.Errorf("invalid object logged %d times", n)
	}
	add(t, s, "pods", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "shop"}, Status: corev1.PodStatus{PodIP: "10.0.0.1"}})
	st2 := s.Snapshot()
	if st2.Pods.Get("shop/bad") == nil || st2.Pods.Len() != 2 {
		t.Errorf("fixed pod missing: %v", st2.Pods)
	}
	if st.Pods.Len() != 1 {
		t.Error("earlier snapshot changed")
	}
	if st2.Changes == nil || st2.Changes.Since != st.Generation || len(st2.Changes.Pods) != 1 || st2.Changes.Pods[0] != "shop/bad" {
		t.Errorf("second snapshot's changes: %+v, want pod shop/bad since %d", st2.Changes, st.Generation)
	}
	if s.Snapshot() != st2 {
		t.Error("a snapshot without changes is not the previous one")
	}

	// A version that turns invalid removes the object; a tombstone removes it too.
	add(t, s, "pods", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "shop"},
		Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "10.0.0.2"}}}})
	if st3 := s.Snapshot(); st3.Pods.Get("shop/bad") != nil {
		t.Error("a pod that turned invalid is still in the snapshot")
	}
	for _, ni := range s.informers {
		if ni.resource == "nodes" {
			ni.events.remove(cache.DeletedFinalStateUnknown{Key: "node-1", Obj: node})
		}
	}
	if nodes, _ := s.Nodes(); len(s.Snapshot().Nodes) != 0 || len(nodes) != 0 {
		t.Errorf("tombstone did not remove the node: %v", s.Snapshot().Nodes)
	}
}

func TestUnchanged(t *testing.T) {
	a := TransformPod(fullPod()).(*cluster.Pod)
	b := TransformPod(fullPod()).(*cluster.Pod)
	b.ResourceVersion = "99999"
	if !unchanged(a, b) {
		t.Error("resourceVersion-only change is a change")
	}
	c := TransformPod(fullPod()).(*cluster.Pod)
	c.IPs = []netip.Addr{netip.MustParseAddr("10.244.1.6")}
	if unchanged(a, c) {
		t.Error("pod IP change not seen")
	}
	d := TransformPod(fullPod()).(*cluster.Pod)
	d.Labels = map[string]string{"app": "other"}
	if unchanged(a, d) {
		t.Error("label change not seen")
	}
	e := TransformPod(fullPod()).(*cluster.Pod)
	e.Ports = []cluster.ContainerPort{{Name: "other", Port: 8080, Protocol: corev1.ProtocolTCP}}
	if unchanged(a, e) {
		t.Error("port change not seen")
	}
	f := TransformPod(fullPod()).(*cluster.Pod)
	f.NodeName = "node-9"
	if unchanged(a, f) {
		t.Error("node change not seen")
	}
	if a.ResourceVersion != "12345" || b.ResourceVersion != "99999" {
		t.Error("unchanged modified its arguments")
	}
	// An invalid pod updated in what the agent does not keep stays unchanged (it is not logged
	// again); one whose problem changed, or that turned valid, is a change.
	invalid := func(rv, ip string) any {
		p := fullPod()
		p.ResourceVersion = rv
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}, {IP: "10.244.1.9"}} // two IPv4 addresses
		p.Status.PodIP = ip
		return TransformPod(p)
	}
	i1, i2, i3 := invalid("1", "10.244.1.5"), invalid("2", "10.244.1.5"), invalid("3", "10.244.1.6")
	if _, ok := i1.(*invalidObject); !ok {
		t.Fatalf("not invalid: %#v", i1)
	}
	if !unchanged(i1, i2) || unchanged(i1, i3) || unchanged(i1, a) || unchanged(a, i1) {
		t.Error("invalid pod comparison")
	}
	n1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1"}}
	n2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "2"}}
	if !unchanged(n1, n2) || unchanged(n1, a) {
		t.Error("node comparison")
	}
}

func TestRunUnreachable(t *testing.T) {
	// An API server that refuses every request and counts them: once each informer's list has
	// been refused, the source has had its chance to sync.
	var mu sync.Mutex
	refused := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		refused[r.URL.Path] = true
		mu.Unlock()
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s := New(c, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func() {}) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(refused)
		mu.Unlock()
		if n >= len(s.informers)+1 { // and pods
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d resources were listed", n, len(s.informers)+1)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	if s.HasSynced() {
		t.Error("synced without an API server")
	}
	// The pods' failed list is logged as every other kind's.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), `msg="kubernetes list/watch failed; retrying" resource=pods`); {
		if time.Now().After(deadline) {
			t.Fatalf("no failed list of pods logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if err := s.Run(context.Background(), func() {}); err == nil {
		t.Error("second Run did not fail")
	}
}
