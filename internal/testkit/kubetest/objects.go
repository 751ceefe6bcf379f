package kubetest

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// EnsureNamespace creates the namespace with the given labels unless it exists (an existing one is
// left as it is).
func EnsureNamespace(ctx context.Context, c kubernetes.Interface, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// SetPodRunning does what a kubelet would once the pod's sandbox is up: it writes phase Running,
// the Ready conditions, status.podIP and status.podIPs (ips in order, at most one per IP family)
// through the status subresource. It reads the current pod (only pod's namespace and name are used)
// and retries on conflicts. It returns the updated pod.
func SetPodRunning(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, ips ...string) (*corev1.Pod, error) {
	podIPs := make([]corev1.PodIP, 0, len(ips))
	for _, ip := range ips {
		if _, err := netip.ParseAddr(ip); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		podIPs = append(podIPs, corev1.PodIP{IP: ip})
	}
	pods := c.CoreV1().Pods(pod.Namespace)
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		cur.Status.Phase = corev1.PodRunning
		if cur.Status.StartTime == nil {
			cur.Status.StartTime = &now
		}
		cur.Status.PodIPs = podIPs
		cur.Status.PodIP = ""
		if len(podIPs) > 0 {
			cur.Status.PodIP = podIPs[0].IP
		}
		for _, typ := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			setCondition(&cur.Status, typ, now)
		}
		out, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("setting pod %s/%s running: %w", pod.Namespace, pod.Name, err)
	}
	return out, nil
}

func setCondition(st *corev1.PodStatus, typ corev1.PodConditionType, now metav1.Time) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == typ {
			if st.Conditions[i].Status != corev1.ConditionTrue {
				st.Conditions[i].Status = corev1.ConditionTrue
				st.Conditions[i].LastTransitionTime = now
			}
			return
		}
	}
	st.Conditions = append(st.Conditions, corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, LastTransitionTime: now})
}

// DeletePodNow deletes a pod with a zero grace period. Without a kubelet, a pod bound to a node
// and deleted gracefully would only get a deletionTimestamp and stay until the grace period ran out
// and a kubelet confirmed; this removes it at once, as `kubectl delete --force --grace-period=0`.
// It returns the resourceVersion of the delete (see DeleteNow).
func DeletePodNow(ctx context.Context, c kubernetes.Interface, namespace, name string) (uint64, error) {
	return DeleteNow(ctx, c.CoreV1().RESTClient(), "pods", namespace, name)
}

// DeleteNow deletes an object with a zero grace period through rc (the REST client of the
// object's API group, such as CoreV1().RESTClient()) and returns the resourceVersion of the
// delete, as watchers see it on the DELETED event: a test needs it to wait until an agent has
// seen the delete, and the typed clients' Delete does not return it (the API server returns the
// deleted object for some resources and only a Status for others, so it is read from a watch).
func DeleteNow(ctx context.Context, rc rest.Interface, resource, namespace, name string) (uint64, error) {
	what := fmt.Sprintf("deleting %s %s/%s", resource, namespace, name)
	// No resourceVersion: the watch starts from the current state (an ADDED event for the
	// object, skipped below), so the delete that follows is in it. A version just read could
	// be ahead of the API server's watch cache, which then refuses the watch.
	w, err := rc.Get().NamespaceIfScoped(namespace, namespace != "").Resource(resource).
		VersionedParams(&metav1.ListOptions{Watch: true, FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}, metav1.ParameterCodec).
		Watch(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: watching: %w", what, err)
	}
	defer w.Stop()
	zero := int64(0)
	if err := rc.Delete().NamespaceIfScoped(namespace, namespace != "").Resource(resource).Name(name).
		Body(&metav1.DeleteOptions{GracePeriodSeconds: &zero}).Do(ctx).Error(); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return 0, fmt.Errorf("%s: watch: %v", what, apierrors.FromObject(ev.Object))
		}
		if ev.Type != watch.Deleted {
			continue
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		rv, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: resourceVersion %q: %w", what, m.GetResourceVersion(), err)
		}
		return rv, nil
	}
	return 0, fmt.Errorf("%s: the watch ended before the DELETED event (%v)", what, ctx.Err())
}
