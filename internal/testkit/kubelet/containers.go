package kubelet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// runInit runs an init container until it succeeds. It returns false when the pod cannot go
// on: it is being killed, or the container failed under restartPolicy Never.
func (p *podState) runInit(c *container) bool {
	delay := newBackoff()
	for {
		code, startErr := p.runInstance(c)
		if p.ctx.Err() != nil {
			return false
		}
		if startErr == nil && code == 0 {
			p.mu.Lock()
			c.succeeded = true
			p.mu.Unlock()
			return true
		}
		if startErr == nil && p.restartPolicy == corev1.RestartPolicyNever {
			p.mu.Lock()
			p.initFailed = true
			p.mu.Unlock()
			p.changed()
			p.maybeTerminal()
			return false
		}
		if !p.backOff(c, delay.next(), startErr) {
			return false
		}
	}
}

// waitStarted waits until a sidecar has started, or the pod is being killed.
func (p *podState) waitStarted(c *container) bool {
	for {
		p.mu.Lock()
		started := c.started
		p.mu.Unlock()
		if started {
			return true
		}
		if !sleepCtx(p.ctx, 50*time.Millisecond) {
			return false
		}
	}
}

// supervise runs an app container (or a sidecar) and restarts it by the restart policy.
func (p *podState) supervise(c *container) {
	defer p.sups.Done()
	delay := newBackoff()
	for {
		began := time.Now()
		code, startErr := p.runInstance(c)
		if p.ctx.Err() != nil {
			return
		}
		if startErr == nil {
			policy := p.restartPolicy
			if c.sidecar {
				policy = corev1.RestartPolicyAlways
			}
			if policy == corev1.RestartPolicyNever || policy == corev1.RestartPolicyOnFailure && code == 0 {
				p.maybeTerminal()
				return
			}
			if time.Since(began) > backoffReset {
				delay = newBackoff()
			}
		}
		if !p.backOff(c, delay.next(), startErr) {
			return
		}
	}
}

// backOff shows the container waiting for its restart and waits; false if the pod is being
// killed meanwhile.
func (p *podState) backOff(c *container, d time.Duration, startErr error) bool {
	p.mu.Lock()
	if startErr != nil {
		reason := "RunContainerError"
		var ce configError
		if errors.As(startErr, &ce) {
			reason = "CreateContainerConfigError"
		}
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: startErr.Error()}}
	} else {
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %v restarting failed container=%s pod=%s_%s(%s)", d, c.spec.Name, p.pod.Name, p.pod.Namespace, p.uid),
		}}
	}
	p.mu.Unlock()
	p.changed()
	return sleepCtx(p.ctx, d)
}

// configError is a container that cannot be started as configured (its environment).
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// runInstance starts one instance of c and waits for it to exit. startErr is set when it did
// not start; otherwise code is its exit code (128+n when killed by signal n).
func (p *podState) runInstance(c *container) (code int, startErr error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	p.mu.Lock()
	pod := p.pod.DeepCopy()
	sb := p.sb
	p.mu.Unlock()
	if sb == nil {
		return 0, errors.New("the pod's sandbox is gone")
	}
	podIPs, hostIPs := p.addresses(sb)
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	env, err := resolveEnv(ctx, p.d.cfg.Client, pod, &c.spec, podIPs, hostIPs)
	cancel()
	if err != nil {
		return 0, configError{fmt.Errorf("container %s: %w", c.spec.Name, err)}
	}
	hostname := podHostname(pod)
	if sb.hostNetwork {
		hostname = p.d.cfg.NodeName
	}
	penv := processEnv(env, hostname)
	argv := containerArgv(&c.spec, env)
	path, err := lookPathIn(sb.rootfs, argv[0], penv)
	if err != nil {
		return 0, fmt.Errorf("container %s: %w", c.spec.Name, err)
	}

	p.mu.Lock()
	instance := c.instances
	p.mu.Unlock()
	logDir := filepath.Join(p.dir, "logs", c.spec.Name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return 0, err
	}
	lf, err := newLogFile(filepath.Join(logDir, fmt.Sprintf("%d.log", instance)))
	if err != nil {
		return 0, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		lf.closeWhenDone()
		return 0, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		lf.closeWhenDone()
		return 0, err
	}
	dir := c.spec.WorkingDir
	if dir == "" {
		dir = "/"
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   argv,
		Env:    penv,
		Dir:    dir,
		Stdout: outW,
		Stderr: errW,
		// Its own process group: the container's processes are signaled together, and all
		// die with it, as they would with their PID namespace.
		SysProcAttr: &unix.SysProcAttr{Setpgid: true},
	}
	err = sb.start(p.d.spawner, cmd)
	outW.Close()
	errW.Close()
	lf.copyStream("stdout", outR)
	lf.copyStream("stderr", errR)
	lf.closeWhenDone()
	if err != nil {
		return 0, fmt.Errorf("container %s: starting %q: %w", c.spec.Name, argv, err)
	}

	started := metav1.Now()
	id := newContainerID()
	exited := make(chan struct{})
	p.mu.Lock()
	if c.instances > 0 {
		c.restarts++
	}
	c.instances++
	c.id, c.proc, c.exited, c.env, c.penv = id, cmd.Process, exited, env, penv
	c.logs = append(c.logs, lf)
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
	c.started = c.spec.StartupProbe == nil
	c.ready = c.spec.ReadinessProbe == nil && (!c.init || c.sidecar)
	if p.ctx.Err() != nil {
		// Killed while starting: killContainers did not see this process.
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	}
	p.mu.Unlock()
	p.changed()
	p.logf("container %s started: pid %d, %q", c.spec.Name, cmd.Process.Pid, argv)

	probeCtx, stopProbes := context.WithCancel(p.ctx)
	probesDone := p.startProbes(probeCtx, c, cmd.Process)
	_ = cmd.Wait() // the exit status is in ProcessState
	// The rest of the container's processes go with it.
	_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	stopProbes()
	<-probesDone

	code, signal := exitStatus(cmd.ProcessState)
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	p.mu.Lock()
	c.proc = nil
	c.ready = false
	term := &corev1.ContainerStateTerminated{
		ExitCode:    int32(code),
		Signal:      int32(signal),
		Reason:      reason,
		StartedAt:   started,
		FinishedAt:  metav1.Now(),
		ContainerID: containerIDPrefix + id,
	}
	c.state = corev1.ContainerState{Terminated: term}
	c.prevExit, c.lastExit = c.lastExit, term.DeepCopy()
	close(exited)
	p.mu.Unlock()
	p.changed()
	p.logf("container %s exited with code %d", c.spec.Name, code)
	return code, nil
}

const containerIDPrefix = "netwarden://"

func newContainerID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// exitStatus is the exit code a runtime reports: the process's, or 128+signal.
func exitStatus(ps *os.ProcessState) (code, signal int) {
	if ps == nil {
		return 255, 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), int(ws.Signal())
	}
	return ps.ExitCode(), 0
}

type backoff struct{ cur time.Duration }

func newBackoff() *backoff { return &backoff{} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = backoffInitial
	} else if b.cur *= 2; b.cur > backoffMax {
		b.cur = backoffMax
	}
	return b.cur
}

// sleepCtx sleeps d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
