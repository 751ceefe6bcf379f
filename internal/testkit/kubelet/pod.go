package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// Restart back-off of crashed containers: shorter than the kubelet's (10 s doubling to 5 min)
// because test clusters wait on restarts; it is reset once an instance has run for
// backoffReset.
const (
	backoffInitial = time.Second
	backoffMax     = 30 * time.Second
	backoffReset   = 2 * time.Minute
)

// podState is a pod the daemon runs, from CreatePod until it is gone.
type podState struct {
	d   *Daemon
	key string
	uid types.UID
	dir string // StateDir/pods/<namespace>_<name>_<uid>

	mu  sync.Mutex
	pod *corev1.Pod // as last given by the API (status not used)
	// restartPolicy is read without the lock (the spec cannot change).
	restartPolicy corev1.RestartPolicy
	sb            *sandbox
	sbReady       bool
	sbErr         string
	initDone      bool
	initFailed    bool
	terminal      bool // no container runs or will run again: the sandbox is released
	final         bool // killed for deletion or Stop
	containers    []*container
	conds         map[corev1.PodConditionType]corev1.PodCondition
	startTime     metav1.Time
	execs         map[*os.Process]struct{}

	ctx     context.Context // canceled when the pod is being killed
	cancel  context.CancelFunc
	runDone chan struct{}  // the start-up goroutine (sandbox, init containers) has returned
	sups    sync.WaitGroup // container supervisors
	dying   sync.Once
	gone    chan struct{} // everything is released

	teardownMu sync.Mutex
	sendMu     sync.Mutex
	dirty      chan struct{}
}

// container is one init or app container of a pod and its current instance.
type container struct {
	spec        corev1.Container
	init        bool
	sidecar     bool // an init container with restartPolicy Always
	unsupported string
	state       corev1.ContainerState
	lastExit    *corev1.ContainerStateTerminated // of the latest instance that exited
	prevExit    *corev1.ContainerStateTerminated // of the one before it
	restarts    int32
	instances   int32
	started     bool
	ready       bool
	succeeded   bool // an init container that completed
	id          string
	proc        *os.Process
	exited      chan struct{} // closed when the current instance has exited
	env         []corev1.EnvVar
	penv        []string
	logs        []*logFile // one per instance
}

func newPodState(d *Daemon, pod *corev1.Pod) *podState {
	ctx, cancel := context.WithCancel(context.Background())
	p := &podState{
		d:             d,
		key:           pod.Namespace + "/" + pod.Name,
		uid:           pod.UID,
		dir:           filepath.Join(d.cfg.StateDir, "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		pod:           pod.DeepCopy(),
		restartPolicy: pod.Spec.RestartPolicy,
		conds:         map[corev1.PodConditionType]corev1.PodCondition{},
		startTime:     metav1.Now(),
		execs:         map[*os.Process]struct{}{},
		ctx:           ctx,
		cancel:        cancel,
		runDone:       make(chan struct{}),
		gone:          make(chan struct{}),
		dirty:         make(chan struct{}, 1),
	}
	add := func(c corev1.Container, init bool) {
		ct := &container{spec: c, init: init, sidecar: init && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways}
		reason := "ContainerCreating"
		if !init && len(pod.Spec.InitContainers) > 0 {
			reason = "PodInitializing"
		}
		ct.state.Waiting = &corev1.ContainerStateWaiting{Reason: reason}
		if !isAgnhost(c.Image) {
			ct.unsupported = unsupportedImageMessage(c.Image)
			ct.state.Waiting = &corev1.ContainerStateWaiting{Reason: "ImageNotSupported", Message: ct.unsupported}
		}
		p.containers = append(p.containers, ct)
	}
	for _, c := range pod.Spec.InitContainers {
		add(c, true)
	}
	for _, c := range pod.Spec.Containers {
		add(c, false)
	}
	return p
}

func (p *podState) logf(format string, args ...any) {
	p.d.cfg.Logf("kubelet %s: pod %s: %s", p.d.cfg.NodeName, p.key, fmt.Sprintf(format, args...))
}

// changed schedules a status notification.
func (p *podState) changed() {
	select {
	case p.dirty <- struct{}{}:
	default:
	}
}

// notifier sends the status after changes, until the pod is gone. Each send builds the status
// then, so a late send never carries an older state than an earlier one.
func (p *podState) notifier() {
	for {
		select {
		case <-p.dirty:
			p.sendStatus()
		case <-p.gone:
			return
		}
	}
}

func (p *podState) sendStatus() {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.d.provider.notify(p.snapshot())
}

// snapshot is the pod with its current status.
func (p *podState) snapshot() *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.pod.DeepCopy()
	out.Status = p.statusLocked()
	return out
}

// run brings the pod up: sandbox, init containers in order, then the app containers' supervisors.
func (p *podState) run() {
	defer close(p.runDone)
	p.changed()
	delay := newBackoff()
	for {
		err := p.setupSandbox()
		if err == nil {
			break
		}
		p.logf("setting up the sandbox: %v", err)
		p.mu.Lock()
		p.sbErr = err.Error()
		p.mu.Unlock()
		p.changed()
		if !sleepCtx(p.ctx, delay.next()) {
			return
		}
	}
	p.mu.Lock()
	p.sbReady, p.sbErr = true, ""
	p.mu.Unlock()
	p.changed()

	for _, c := range p.containers {
		if !c.init {
			continue
		}
		if c.unsupported != "" {
			return // the pod stays Pending: nothing after this init container can start
		}
		if c.sidecar {
			p.sups.Add(1)
			go p.supervise(c)
			if !p.waitStarted(c) {
				return
			}
			continue
		}
		if !p.runInit(c) {
			return
		}
	}
	p.mu.Lock()
	p.initDone = true
	p.mu.Unlock()
	p.changed()

	if p.ctx.Err() != nil {
		return
	}
	for _, c := range p.containers {
		if c.init || c.unsupported != "" {
			continue
		}
		p.sups.Add(1)
		go p.supervise(c)
	}
}

// setupSandbox makes the pod's namespaces, network and root filesystem. On failure, what was
// made is removed again.
func (p *podState) setupSandbox() (err error) {
	p.mu.Lock()
	pod := p.pod.DeepCopy()
	p.mu.Unlock()
	if err := os.MkdirAll(filepath.Join(p.dir, "logs"), 0o755); err != nil {
		return err
	}
	sb := &sandbox{hostNetwork: pod.Spec.HostNetwork, rootfs: filepath.Join(p.dir, "rootfs")}
	defer func() {
		if err != nil {
			if terr := p.d.teardownSandbox(sb); terr != nil {
				p.logf("removing a half-made sandbox: %v", terr)
			}
		}
	}()
	hostname := podHostname(pod)
	if sb.hostNetwork {
		hostname = p.d.cfg.NodeName
		if sb.netns, err = os.Open(p.d.cfg.NodeNetNS); err != nil {
			return fmt.Errorf("opening the node's netns: %w", err)
		}
		sb.netnsPath = p.d.cfg.NodeNetNS
		_, sb.uts, err = newNamespaces("", hostname)
		if err != nil {
			return fmt.Errorf("creating the UTS namespace: %w", err)
		}
		sb.ips = append(sb.ips, p.d.cfg.NodeIPs...)
	} else {
		sb.netnsName = netnsNameFor(p.d.cfg.NodeName, pod.Namespace, pod.Name, string(pod.UID))
		sb.netnsPath = filepath.Join(NetNSDir, sb.netnsName)
		if sb.netns, sb.uts, err = newNamespaces(sb.netnsName, hostname); err != nil {
			sb.netnsName = "" // not made: nothing of it to remove
			return fmt.Errorf("creating the namespaces: %w", err)
		}
		if err := setLoopbackUp(sb.netns); err != nil {
			return fmt.Errorf("setting lo up in %s: %w", sb.netnsPath, err)
		}
		sb.cniRT = cniRuntimeConf(pod, sb.netnsPath)
		ctx, cancel := context.WithTimeout(p.ctx, 2*time.Minute)
		sb.ips, err = p.d.cniAdd(ctx, sb.cniRT)
		cancel()
		sb.cniAdded = true // a failed ADD is cleaned up with DEL, as CNI asks of runtimes
		if err != nil {
			return fmt.Errorf("CNI ADD (network %q, netns %s): %w", p.d.cniList.Name, sb.netnsPath, err)
		}
	}
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if len(sb.ips) > 0 && !sb.hostNetwork {
		hosts += sb.ips[0].String() + "\t" + hostname + "\n"
	}
	hostsFile := filepath.Join(p.dir, "hosts")
	if err := os.WriteFile(hostsFile, []byte(hosts), 0o644); err != nil {
		return err
	}
	podIPs, hostIPs := p.addresses(sb)
	vctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	volumes, err := p.prepareVolumes(vctx, pod, podIPs, hostIPs)
	cancel()
	if err != nil {
		return err
	}
	if err := mountRootfs(sb.rootfs, p.d.cfg.Agnhost, hostsFile); err != nil {
		return fmt.Errorf("root filesystem: %w", err)
	}
	if err := p.mountVolumes(pod, sb.rootfs, volumes); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return p.ctx.Err() // killed meanwhile: the deferred teardown releases it
	}
	p.sb = sb
	p.logf("sandbox ready: netns %s, IPs %v", sb.netnsPath, sb.ips)
	return nil
}

func podHostname(pod *corev1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// teardownSandbox undoes a sandbox: CNI DEL, the netns and the root filesystem. Each step
// that succeeded is not done again by a later call.
func (d *Daemon) teardownSandbox(sb *sandbox) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.released = true
	var errs []error
	if sb.cniAdded {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := d.cniDel(ctx, sb.cniRT)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL (netns %s): %w", sb.netnsPath, err))
		} else {
			sb.cniAdded = false
		}
	}
	if sb.uts != nil {
		sb.uts.Close()
		sb.uts = nil
	}
	if sb.netns != nil {
		sb.netns.Close()
		sb.netns = nil
	}
	if sb.netnsName != "" && !sb.netnsRemoved {
		if err := testbed.RemoveNetNSMount(filepath.Join(NetNSDir, sb.netnsName)); err != nil {
			errs = append(errs, err)
		} else {
			sb.netnsRemoved = true
		}
	}
	if sb.rootfs != "" && !sb.rootfsRemoved {
		if err := unmountRootfs(sb.rootfs); err != nil {
			errs = append(errs, err)
		} else {
			sb.rootfsRemoved = true
		}
	}
	return errors.Join(errs...)
}

// maybeTerminal releases the sandbox once the pod is Succeeded or Failed: nothing runs in it
// any more, and its IP goes back to the pool, as the kubelet does.
func (p *podState) maybeTerminal() {
	p.mu.Lock()
	phase := p.phaseLocked()
	if phase != corev1.PodSucceeded && phase != corev1.PodFailed || p.terminal || p.final {
		p.mu.Unlock()
		return
	}
	p.terminal = true
	p.mu.Unlock()
	go func() {
		p.killContainers(p.grace(nil))
		if err := p.releaseSandbox(); err != nil {
			p.logf("releasing the sandbox of the finished pod: %v", err)
		}
		p.changed()
	}()
}

// grace is the pod's termination grace period (override, when set, wins).
func (p *podState) grace(override *int64) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return gracePeriod(p.pod, override)
}

func gracePeriod(pod *corev1.Pod, override *int64) time.Duration {
	switch {
	case override != nil:
		return time.Duration(*override) * time.Second
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// killContainers stops the restarts and kills every running container: SIGTERM to its process
// group, SIGKILL after grace. Exec sessions are killed at once.
func (p *podState) killContainers(grace time.Duration) {
	p.cancel()
	p.mu.Lock()
	type running struct {
		name   string
		proc   *os.Process
		exited chan struct{}
	}
	var live []running
	for _, c := range p.containers {
		if c.proc != nil {
			live = append(live, running{c.spec.Name, c.proc, c.exited})
		}
	}
	for proc := range p.execs {
		_ = unix.Kill(-proc.Pid, unix.SIGKILL)
	}
	p.mu.Unlock()
	for _, r := range live {
		_ = unix.Kill(-r.proc.Pid, unix.SIGTERM)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for _, r := range live {
		select {
		case <-r.exited:
			continue
		case <-deadline.C:
		}
		p.logf("container %s did not stop within %v of SIGTERM: SIGKILL", r.name, grace)
		for _, r := range live {
			_ = unix.Kill(-r.proc.Pid, unix.SIGKILL)
		}
		break
	}
	for _, r := range live {
		<-r.exited
	}
	<-p.runDone
	p.sups.Wait()
}

// releaseSandbox tears the sandbox down once nothing runs in it.
func (p *podState) releaseSandbox() error {
	p.teardownMu.Lock()
	defer p.teardownMu.Unlock()
	p.mu.Lock()
	sb := p.sb
	p.mu.Unlock()
	if sb == nil {
		return nil
	}
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = p.d.teardownSandbox(sb); err == nil {
			break
		}
		time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.sbReady = false
	p.mu.Unlock()
	return nil
}

// kill stops the pod for good (deletion or Stop): containers, sandbox, and with deleteFromAPI
// the pod object, which the kubelet deletes once the pod's containers are gone. It runs once;
// other calls wait for the first.
func (p *podState) kill(grace time.Duration, deleteFromAPI bool) error {
	var err error
	first := false
	p.dying.Do(func() {
		first = true
		p.mu.Lock()
		p.final = true
		p.mu.Unlock()
		p.killContainers(grace)
		err = p.releaseSandbox()
		p.sendStatus()
		// The directory goes before the object, so that a pod gone from the API server has
		// left nothing on the node (as far as this daemon decides it).
		if err == nil {
			// Logs go with the pod. Never below a mount point: the rootfs is gone by now.
			if m, merr := mountsBelow(p.dir); merr == nil && len(m) == 0 {
				if rerr := os.RemoveAll(p.dir); rerr != nil {
					p.logf("removing %s: %v", p.dir, rerr)
				}
			} else {
				p.logf("keeping %s: mounts below it: %v %v", p.dir, m, merr)
			}
		} else {
			p.logf("releasing the sandbox: %v", err)
		}
		if deleteFromAPI {
			p.deleteFromAPI()
		}
		close(p.gone)
	})
	if !first {
		<-p.gone
	}
	return err
}

func (p *podState) deleteFromAPI() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := metav1.NewDeleteOptions(0)
	opts.Preconditions = metav1.NewUIDPreconditions(string(p.uid))
	ns, name, _ := strings.Cut(p.key, "/")
	err := p.d.cfg.Client.CoreV1().Pods(ns).Delete(ctx, name, *opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.logf("deleting the pod object: %v", err)
	}
}

// addresses are the pod's IPs and its node's, as the downward API and env give them.
func (p *podState) addresses(sb *sandbox) (podIPs, hostIPs []string) {
	for _, ip := range sb.ips {
		podIPs = append(podIPs, ip.String())
	}
	for _, ip := range p.d.cfg.NodeIPs {
		hostIPs = append(hostIPs, ip.String())
	}
	return podIPs, hostIPs
}
