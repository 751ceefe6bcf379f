package kubelet

import (
	"context"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	utilexec "k8s.io/utils/exec"
)

// provider is the virtual-kubelet provider: the pod controller calls it for the pods bound to
// the node, and the kubelet API handlers for exec, logs and port-forward.
type provider struct {
	d *Daemon

	mu    sync.Mutex
	pods  map[string]*podState   // namespace/name -> the pod running under that name
	dying map[*podState]struct{} // being killed: out of pods, so that a new pod can take the name
	cb    func(*corev1.Pod)
	// kills counts the goroutines of killLocked: Stop waits for them, so that none logs after it.
	kills sync.WaitGroup
}

func newProvider(d *Daemon) *provider {
	return &provider{d: d, pods: map[string]*podState{}, dying: map[*podState]struct{}{}}
}

// NotifyPods implements node.PodNotifier: cb gets each status change.
func (pr *provider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	pr.mu.Lock()
	pr.cb = cb
	pr.mu.Unlock()
}

func (pr *provider) notify(pod *corev1.Pod) {
	pr.mu.Lock()
	cb := pr.cb
	cur := pr.pods[pod.Namespace+"/"+pod.Name]
	pr.mu.Unlock()
	if cur != nil && cur.uid != pod.UID {
		// The status of a pod that a new one of the same name replaced (a force delete and a
		// create): virtual-kubelet queues statuses by name, so this one would stand in for the
		// new pod's, its UID precondition failing at every retry.
		return
	}
	if cb != nil {
		cb(pod)
	}
}

// CreatePod starts running a pod; the work happens in the background, reported through
// NotifyPods.
func (pr *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	if pod.Spec.NodeName != pr.d.cfg.NodeName {
		return errdefs.InvalidInputf("pod %s/%s is bound to node %q, not %q", pod.Namespace, pod.Name, pod.Spec.NodeName, pr.d.cfg.NodeName)
	}
	key := pod.Namespace + "/" + pod.Name
	pr.mu.Lock()
	if old := pr.pods[key]; old != nil {
		if old.uid == pod.UID {
			pr.mu.Unlock()
			return nil
		}
		// The API server holds one pod per name: the old one was deleted, and its deletion was
		// missed (a force delete and a re-create in one informer update). It goes now, beside
		// the new one (their namespaces and directories differ by UID).
		pr.killLocked(old, old.grace(nil), false)
	}
	p := newPodState(pr.d, pod)
	pr.pods[key] = p
	pr.mu.Unlock()
	go p.notifier()
	go p.run()
	return nil
}

// killLocked moves p from pods to dying and kills it in the background. pr.mu is held.
func (pr *provider) killLocked(p *podState, grace time.Duration, deleteFromAPI bool) {
	if pr.pods[p.key] == p {
		delete(pr.pods, p.key)
	}
	pr.dying[p] = struct{}{}
	p.logf("killing (grace period %v)", grace)
	pr.kills.Add(1)
	go func() {
		defer pr.kills.Done()
		began := time.Now()
		if err := p.kill(grace, deleteFromAPI); err != nil {
			p.logf("killing: %v", err)
		} else {
			p.logf("removed in %v", time.Since(began).Round(time.Millisecond))
		}
		pr.mu.Lock()
		delete(pr.dying, p)
		pr.mu.Unlock()
	}()
}

// UpdatePod takes the pod's new metadata; the spec of a running pod does not change (an image
// change is not acted upon).
func (pr *provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p := pr.get(pod.Namespace, pod.Name)
	if p == nil || p.uid != pod.UID {
		return pr.CreatePod(ctx, pod)
	}
	p.mu.Lock()
	spec := p.pod.Spec
	p.pod = pod.DeepCopy()
	p.pod.Spec = spec
	p.mu.Unlock()
	p.changed()
	return nil
}

// DeletePod starts killing the pod with its grace period. Once its containers have stopped
// and its sandbox is gone, the pod object is deleted from the API server.
func (pr *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	key := pod.Namespace + "/" + pod.Name
	pr.mu.Lock()
	p := pr.pods[key]
	if p == nil || pod.UID != "" && p.uid != pod.UID {
		for q := range pr.dying {
			if q.key == key && (pod.UID == "" || q.uid == pod.UID) {
				pr.mu.Unlock()
				return nil // already going
			}
		}
		pr.mu.Unlock()
		return errdefs.NotFoundf("pod %s (uid %s) does not run on node %s", key, pod.UID, pr.d.cfg.NodeName)
	}
	pr.killLocked(p, gracePeriod(pod, nil), true)
	pr.mu.Unlock()
	return nil
}

// stopAll kills every pod (grace at most maxGrace) without deleting the pod objects.
func (pr *provider) stopAll(maxGrace time.Duration) []error {
	pr.mu.Lock()
	var all []*podState
	for _, p := range pr.pods {
		all = append(all, p)
	}
	for p := range pr.dying {
		all = append(all, p)
	}
	pr.pods = map[string]*podState{}
	pr.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(all))
	for i, p := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grace := min(p.grace(nil), maxGrace)
			if err := p.kill(grace, false); err != nil {
				errs[i] = fmt.Errorf("pod %s: %w", p.key, err)
			}
		}()
	}
	wg.Wait()
	pr.kills.Wait()
	return errs
}

func (pr *provider) get(namespace, name string) *podState {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.pods[namespace+"/"+name]
}

// getAny is get, or else a pod of that name still being killed: its logs and exec stay
// reachable until it is gone, as with the kubelet.
func (pr *provider) getAny(namespace, name string) *podState {
	if p := pr.get(namespace, name); p != nil {
		return p
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for p := range pr.dying {
		if p.key == namespace+"/"+name {
			return p
		}
	}
	return nil
}

// GetPod returns the pod with its current status.
func (pr *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p := pr.get(namespace, name)
	if p == nil {
		return nil, errdefs.NotFoundf("pod %s/%s does not run on node %s", namespace, name, pr.d.cfg.NodeName)
	}
	return p.snapshot(), nil
}

// GetPodStatus returns the pod's current status.
func (pr *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := pr.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns the pods the node runs.
func (pr *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	pr.mu.Lock()
	all := make([]*podState, 0, len(pr.pods))
	for _, p := range pr.pods {
		all = append(all, p)
	}
	pr.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(all))
	for _, p := range all {
		out = append(out, p.snapshot())
	}
	return out, nil
}

func (pr *provider) container(namespace, name, containerName string) (*podState, *container, error) {
	p := pr.getAny(namespace, name)
	if p == nil {
		return nil, nil, errdefs.NotFoundf("pod %s/%s does not run on node %s", namespace, name, pr.d.cfg.NodeName)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var names []string
	for _, c := range p.containers {
		if c.spec.Name == containerName {
			return p, c, nil
		}
		names = append(names, c.spec.Name)
	}
	return nil, nil, errdefs.NotFoundf("pod %s/%s has no container %q (it has %v)", namespace, name, containerName, names)
}

// RunInContainer runs an exec session. A command that exits non-zero yields an
// exec.CodeExitError: the API handler passes its code on to the client, so that remotecommand
// reports it (kubectl exec exits with it).
func (pr *provider) RunInContainer(ctx context.Context, namespace, name, containerName string, cmd []string, attach api.AttachIO) error {
	p, c, err := pr.container(namespace, name, containerName)
	if err != nil {
		return err
	}
	stdio := execIO{tty: attach.TTY(), resize: attach.Resize()}
	// The handler's streams are typed interfaces: only attached ones may be used.
	if r := attach.Stdin(); r != nil && !isNilInterface(r) {
		stdio.stdin = r
	}
	if w := attach.Stdout(); w != nil && !isNilInterface(w) {
		stdio.stdout = w
	}
	if w := attach.Stderr(); w != nil && !isNilInterface(w) {
		stdio.stderr = w
	}
	code, err := p.execIn(ctx, c, cmd, stdio)
	if err != nil {
		return errdefs.AsInvalidInput(fmt.Errorf("exec in %s/%s container %s: %w", namespace, name, containerName, err))
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

// AttachToContainer is not supported: container stdin is not kept.
func (pr *provider) AttachToContainer(_ context.Context, namespace, name, containerName string, _ api.AttachIO) error {
	return errdefs.InvalidInputf("attach to %s/%s container %s: not supported by this node (use exec or containerLogs)", namespace, name, containerName)
}

// GetContainerLogs returns the container's log from its current instance (or the previous one
// with Previous).
func (pr *provider) GetContainerLogs(ctx context.Context, namespace, name, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	p, c, err := pr.container(namespace, name, containerName)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	logs := append([]*logFile{}, c.logs...)
	p.mu.Unlock()
	i := len(logs) - 1
	if opts.Previous {
		i--
	}
	if i < 0 {
		what := "has not started yet"
		if opts.Previous {
			what = "has no previous instance"
		}
		return nil, errdefs.InvalidInputf("container %q in pod %s/%s %s", containerName, namespace, name, what)
	}
	return readLogs(ctx, logs[i], opts)
}

// PortForward connects stream to port on the pod's loopback, as the kubelet's port-forward does.
func (pr *provider) PortForward(ctx context.Context, namespace, name string, port int32, stream io.ReadWriteCloser) error {
	p := pr.get(namespace, name)
	if p == nil {
		return errdefs.NotFoundf("pod %s/%s does not run on node %s", namespace, name, pr.d.cfg.NodeName)
	}
	p.mu.Lock()
	var nsPath string
	if p.sb != nil && p.sb.usable() {
		nsPath = p.sb.netnsPath
	}
	p.mu.Unlock()
	if nsPath == "" {
		return errdefs.InvalidInputf("pod %s/%s has no network namespace (yet)", namespace, name)
	}
	var conn net.Conn
	var err error
	for _, host := range []string{"127.0.0.1", "::1"} {
		if conn, err = dialIn(ctx, nsPath, net.JoinHostPort(host, strconv.Itoa(int(port)))); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("port-forward to %s/%s port %d: %w", namespace, name, port, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// GetStatsSummary is not supported.
func (pr *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errdefs.NotFound("stats are not supported by this node")
}

// GetMetricsResource is not supported.
func (pr *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errdefs.NotFound("metrics are not supported by this node")
}

// isNilInterface reports a typed nil in an interface (a nil *T passed as an io.Writer).
func isNilInterface(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// podsGetter is the pod client of virtual-kubelet's pod controller. Its deletes wait for the
// daemon to finish killing the pod: the controller force-deletes a pod once its grace period is
// over, and the object must not go before the pod's sandbox does (the kubelet removes it only
// then, and tests take its absence to mean the IP and namespace are free).
type podsGetter struct {
	corev1client.PodsGetter
	pr *provider
}

func (g podsGetter) Pods(namespace string) corev1client.PodInterface {
	return podsClient{PodInterface: g.PodsGetter.Pods(namespace), pr: g.pr, namespace: namespace}
}

type podsClient struct {
	corev1client.PodInterface
	pr        *provider
	namespace string
}

func (c podsClient) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	c.pr.waitKilled(ctx, c.namespace+"/"+name)
	return c.PodInterface.Delete(ctx, name, opts)
}

// waitKilled waits (at most killWait) until no pod of that key is being killed.
func (pr *provider) waitKilled(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(ctx, killWait)
	defer cancel()
	for {
		var gone chan struct{}
		pr.mu.Lock()
		for p := range pr.dying {
			if p.key != key {
				continue
			}
			select {
			case <-p.gone: // killed, about to leave dying
			default:
				gone = p.gone
			}
		}
		pr.mu.Unlock()
		if gone == nil {
			return
		}
		select {
		case <-gone:
		case <-ctx.Done():
			return
		}
	}
}

// killWait bounds how long a force delete waits for a pod's kill (SIGKILL comes at the end of
// the grace period; what takes long after it is a CNI DEL or an unmount that hangs).
const killWait = 2 * time.Minute
