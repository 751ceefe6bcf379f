package kubeapi

import (
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func feedPod(name, rv, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: rv, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
}

// invalidPod has two IPv4 addresses, which validation refuses.
func invalidPod(name, rv string) *corev1.Pod {
	p := feedPod(name, rv, "", nil)
	p.Status.PodIPs = []corev1.PodIP{{IP: "10.0.0.8"}, {IP: "10.0.0.9"}}
	return p
}

// TestPodFeed drives the pod reflector's store as the reflector does: a first list, updates
// that change nothing kept and ones that do, a pod turning invalid and staying so, a list
// again after the watch fell behind (which drops the pods deleted meanwhile) and a delete. The
// Tracker must hold what the API server holds at each step.
func TestPodFeed(t *testing.T) {
	var logs syncBuffer
	s := New(unreachable(t), slog.New(slog.NewTextHandler(&logs, nil)))
	f := s.pods
	notified := 0
	f.notify = func() { notified++ }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	invalidLogs := func() int { return strings.Count(logs.String(), `key=shop/bad`) }

	must(f.Replace([]any{feedPod("a", "10", "10.0.0.1", map[string]string{"app": "web"}), feedPod("b", "11", "10.0.0.2", nil), invalidPod("bad", "12"),
		feedPod("d", "12", "10.0.0.4", nil)}, "12"))
	st := s.Snapshot()
	if st.Pods.Len() != 3 || st.Pods.Get("shop/a") == nil || st.Pods.Get("shop/b") == nil || !f.synced.Load() || notified != 1 {
		t.Fatalf("after the first list: %d pods, synced %v, notified %d", st.Pods.Len(), f.synced.Load(), notified)
	}
	if !st.Revision.Covers("pods", 12) || invalidLogs() != 1 {
		t.Fatalf("first list: revision covers 12: %v, invalid pod logged %d times", st.Revision.Covers("pods", 12), invalidLogs())
	}
	a := st.Pods.Get("shop/a")

	// An update of nothing kept leaves the pod as it was, and moves the revision on.
	must(f.Update(feedPod("a", "13", "10.0.0.1", map[string]string{"app": "web"})))
	if st := s.Snapshot(); st.Pods.Get("shop/a") != a || !st.Revision.Covers("pods", 13) {
		t.Fatal("a status-only update replaced the pod, or its version is not covered")
	}
	must(f.Update(feedPod("a", "14", "10.0.0.1", map[string]string{"app": "api"})))
	if p := s.Snapshot().Pods.Get("shop/a"); p == a || p.Labels["app"] != "api" {
		t.Fatalf("a relabelled pod was not replaced: %+v", p)
	}
	// Still invalid for the same reasons: not logged again.
	must(f.Update(invalidPod("bad", "15")))
	if invalidLogs() != 1 {
		t.Fatalf("an update that leaves a pod invalid logged it again (%d times)", invalidLogs())
	}
	// b turns invalid: it leaves the Tracker.
	must(f.Update(invalidPod("b", "16")))
	if s.Snapshot().Pods.Get("shop/b") != nil {
		t.Fatal("a pod that turned invalid is still held")
	}

	// A list again: a, c and bad exist; b (invalid) and d (valid) were deleted while the watch
	// was down.
	must(f.Replace([]any{feedPod("a", "14", "10.0.0.1", map[string]string{"app": "api"}), feedPod("c", "20", "10.0.0.3", nil), invalidPod("bad", "15")}, "21"))
	st = s.Snapshot()
	if got := st.Pods.Len(); got != 2 || st.Pods.Get("shop/c") == nil || st.Pods.Get("shop/d") != nil || !st.Revision.Covers("pods", 21) {
		t.Fatalf("after the second list: %d pods, covers 21: %v", got, st.Revision.Covers("pods", 21))
	}
	if _, ok := f.invalid["shop/b"]; ok {
		t.Error("a pod deleted while invalid is still remembered")
	}
	if invalidLogs() != 1 {
		t.Errorf("the list logged the pod that stayed invalid again (%d times)", invalidLogs())
	}
	// bad becomes valid.
	must(f.Update(feedPod("bad", "22", "10.0.0.9", nil)))
	must(f.Delete(feedPod("c", "23", "10.0.0.3", nil)))
	st = s.Snapshot()
	if st.Pods.Get("shop/bad") == nil || st.Pods.Get("shop/c") != nil || !st.Revision.Covers("pods", 23) {
		t.Fatalf("after a pod became valid and one was deleted: %d pods", st.Pods.Len())
	}
	if _, ok := f.invalid["shop/bad"]; ok {
		t.Error("a pod that became valid is still remembered as invalid")
	}
	if err := f.Add(&corev1.Namespace{}); err == nil {
		t.Error("a namespace was taken for a pod")
	}
}
