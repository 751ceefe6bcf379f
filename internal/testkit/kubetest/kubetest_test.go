package kubetest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestRequiredVersion(t *testing.T) {
	gomod := []byte("module x\n\nrequire go.etcd.io/etcd/server/v3 v3.7.0\n\nrequire (\n\tk8s.io/kubernetes v1.37.2 // indirect\n)\n")
	if v := requiredVersion(gomod, "k8s.io/kubernetes"); v != "v1.37.2" {
		t.Errorf("k8s.io/kubernetes: %q", v)
	}
	if v := requiredVersion(gomod, "go.etcd.io/etcd/server/v3"); v != "v3.7.0" {
		t.Errorf("etcd: %q", v)
	}
	if v := requiredVersion(gomod, "k8s.io/api"); v != "" {
		t.Errorf("k8s.io/api: %q", v)
	}
}

func TestIntegrationServer(t *testing.T) {
	s := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := s.AdminClient(t)

	v, err := admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server version %s", v.GitVersion)
	if !strings.HasPrefix(v.GitVersion, "v1.") {
		t.Errorf("unexpected server version %q", v.GitVersion)
	}

	// A kubeconfig file with the admin token works like AdminConfig.
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	fromFile := kubernetes.NewForConfigOrDie(cfg)
	if _, err := fromFile.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("kubeconfig client: %v", err)
	}

	// A service-account token authenticates, and RBAC limits it to what it is bound to.
	token := s.CreateServiceAccountToken(t, "agents", "reader")
	cfg, err = clientcmd.BuildConfigFromFlags("", s.Kubeconfig(t, token))
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(cfg)
	if _, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("service account without a role listed pods: err=%v", err)
	}
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "agents", Name: "reader"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC reads bindings through an informer: allow it a moment.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("service account bound to pod-reader cannot list pods: %v", err)
	}
	if _, err := sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("pod-reader listed nodes: err=%v", err)
	}

	// Pods: created Pending in a namespace without a default service account, set running as a
	// kubelet would, and deleted at once although bound to a node.
	if err := EnsureNamespace(ctx, admin, "shop", map[string]string{"team": "a"}); err != nil {
		t.Fatal(err)
	}
	pod, err := admin.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "web", Image: "nginx"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending {
		t.Errorf("new pod phase %q", pod.Status.Phase)
	}
	pod, err = SetPodRunning(ctx, admin, pod, "10.244.1.5", "fd00:10:244:1::5")
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP != "10.244.1.5" || len(pod.Status.PodIPs) != 2 {
		t.Errorf("status after SetPodRunning: %+v", pod.Status)
	}

	// Restart: same URL, certificate and data.
	s.Restart(t)
	got, err := admin.CoreV1().Pods("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got.Status.PodIP != "10.244.1.5" {
		t.Errorf("after restart: pod IP %q", got.Status.PodIP)
	}
	if _, err := sa.CoreV1().Pods("shop").Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Errorf("service-account token after restart: %v", err)
	}

	// The delete's resourceVersion is the one a watcher sees on the DELETED event: tests wait
	// for an agent to have seen a delete by it.
	w, err := admin.CoreV1().Pods("shop").Watch(ctx, metav1.ListOptions{ResourceVersion: got.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	rv, err := DeletePodNow(ctx, admin, "shop", "web")
	if err != nil {
		t.Fatal(err)
	}
	for ev := range w.ResultChan() {
		if ev.Type != watch.Deleted {
			continue
		}
		if got := ev.Object.(*corev1.Pod).ResourceVersion; got != strconv.FormatUint(rv, 10) {
			t.Errorf("DeletePodNow returned resourceVersion %d; the DELETED event carries %s", rv, got)
		}
		break
	}
	if _, err := admin.CoreV1().Pods("shop").Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod still there after DeletePodNow: err=%v", err)
	}
}
