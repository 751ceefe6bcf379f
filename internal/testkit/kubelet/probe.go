package kubelet

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// startProbes runs the container instance's startup, readiness and liveness probes until ctx
// ends; the returned channel is closed then. Probes reach the pod from the node's network
// namespace, as the kubelet's do; exec probes run in the container. A failed liveness (or
// startup) probe kills the instance, and the supervisor restarts it by the restart policy.
func (p *podState) startProbes(ctx context.Context, c *container, proc *os.Process) <-chan struct{} {
	done := make(chan struct{})
	spec := c.spec
	if spec.StartupProbe == nil && spec.ReadinessProbe == nil && spec.LivenessProbe == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		if spec.StartupProbe != nil {
			ok := p.probeLoop(ctx, c, spec.StartupProbe, "startup", func(bool) bool { return false })
			if ctx.Err() != nil {
				return
			}
			if !ok {
				p.logf("container %s failed its startup probe: killing it", spec.Name)
				_ = unix.Kill(-proc.Pid, unix.SIGKILL)
				return
			}
			p.mu.Lock()
			c.started = true
			p.mu.Unlock()
			p.changed()
		}
		var liveness sync.WaitGroup
		defer liveness.Wait()
		if spec.LivenessProbe != nil {
			liveness.Add(1)
			go func() {
				defer liveness.Done()
				ok := p.probeLoop(ctx, c, spec.LivenessProbe, "liveness", func(ok bool) bool { return ok })
				if ctx.Err() == nil && !ok {
					p.logf("container %s failed its liveness probe: killing it", spec.Name)
					_ = unix.Kill(-proc.Pid, unix.SIGTERM)
					if !sleepCtx(ctx, p.grace(spec.LivenessProbe.TerminationGracePeriodSeconds)) {
						return
					}
					_ = unix.Kill(-proc.Pid, unix.SIGKILL)
				}
			}()
		}
		if spec.ReadinessProbe != nil {
			p.probeLoop(ctx, c, spec.ReadinessProbe, "readiness", func(ok bool) bool {
				p.mu.Lock()
				changed := c.ready != ok
				c.ready = ok
				p.mu.Unlock()
				if changed {
					p.changed()
				}
				return true
			})
		}
		<-ctx.Done()
	}()
	return done
}

// probeLoop runs probe every period and reports each threshold-crossing result to onResult,
// while onResult returns true. It returns the last result reported.
func (p *podState) probeLoop(ctx context.Context, c *container, probe *corev1.Probe, kind string, onResult func(ok bool) bool) bool {
	period := secondsOr(probe.PeriodSeconds, 10)
	successes, failures := int(orDefault(probe.SuccessThreshold, 1)), int(orDefault(probe.FailureThreshold, 3))
	if !sleepCtx(ctx, time.Duration(probe.InitialDelaySeconds)*time.Second) {
		return false
	}
	var okRun, failRun int
	result := false
	for {
		err := p.probeOnce(ctx, c, probe)
		if ctx.Err() != nil {
			return result
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
			if okRun >= successes {
				result = true
				if !onResult(true) {
					return true
				}
			}
		} else {
			okRun, failRun = 0, failRun+1
			if failRun == 1 || failRun >= failures {
				p.logf("%s probe of container %s failed: %v", kind, c.spec.Name, err)
			}
			if failRun >= failures {
				result = false
				if !onResult(false) {
					return false
				}
			}
		}
		if !sleepCtx(ctx, period) {
			return result
		}
	}
}

// probeOnce runs a probe; nil is success.
func (p *podState) probeOnce(ctx context.Context, c *container, probe *corev1.Probe) error {
	timeout := secondsOr(probe.TimeoutSeconds, 1)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch h := probe.ProbeHandler; {
	case h.Exec != nil:
		out := &lockedBuffer{}
		code, err := p.execIn(ctx, c, h.Exec.Command, execIO{stdout: out, stderr: out})
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("command %q timed out after %v", h.Exec.Command, timeout)
		}
		if code != 0 {
			return fmt.Errorf("command %q exited with %d: %s", h.Exec.Command, code, strings.TrimSpace(out.String()))
		}
		return nil
	case h.TCPSocket != nil:
		addr, err := p.probeAddr(c, h.TCPSocket.Host, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		conn, err := p.d.dialFromNode(ctx, addr)
		if err != nil {
			return err
		}
		return conn.Close()
	case h.HTTPGet != nil:
		return p.httpProbe(ctx, c, h.HTTPGet)
	case h.GRPC != nil:
		return fmt.Errorf("grpc probes are not supported by this node")
	}
	return fmt.Errorf("probe without a handler")
}

func (p *podState) httpProbe(ctx context.Context, c *container, g *corev1.HTTPGetAction) error {
	addr, err := p.probeAddr(c, g.Host, g.Port)
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := &url.URL{Scheme: scheme, Host: addr}
	full, err := url.Parse(u.String() + path)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, full.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	req.Header.Set("Accept", "*/*")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, _, a string) (net.Conn, error) { return p.d.dialFromNode(ctx, a) },
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as the kubelet's probes
			DisableKeepAlives: true,
		},
		// Redirects to other hosts are not followed by the kubelet either; none are.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.CopyN(io.Discard, resp.Body, 10<<10)
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe %s: status %s", full, resp.Status)
	}
	return nil
}

// probeAddr is host:port of a probe: the pod IP unless the probe names a host, and the port by
// number or by the name of a container port.
func (p *podState) probeAddr(c *container, host string, port intstr.IntOrString) (string, error) {
	n := port.IntValue()
	if port.Type == intstr.String {
		n = 0
		for _, cp := range c.spec.Ports {
			if cp.Name == port.StrVal {
				n = int(cp.ContainerPort)
			}
		}
		if n == 0 {
			if v, err := strconv.Atoi(port.StrVal); err == nil {
				n = v
			}
		}
	}
	if n <= 0 || n > 65535 {
		return "", fmt.Errorf("probe port %q of container %s is not a port number or the name of one of its ports", port.String(), c.spec.Name)
	}
	if host == "" {
		p.mu.Lock()
		if p.sb != nil && len(p.sb.ips) > 0 {
			host = p.sb.ips[0].String()
		}
		p.mu.Unlock()
	}
	if host == "" {
		return "", fmt.Errorf("pod %s has no IP to probe", p.key)
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// dialFromNode opens a TCP connection from the node's network namespace: the socket is made on
// a thread in that namespace and keeps it.
func (d *Daemon) dialFromNode(ctx context.Context, addr string) (net.Conn, error) {
	return dialIn(ctx, d.cfg.NodeNetNS, addr)
}

func dialIn(ctx context.Context, netnsPath, addr string) (net.Conn, error) {
	var conn net.Conn
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		var err error
		// One address and no fallback: the dial runs on this goroutine, whose thread is in the
		// namespace.
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	return conn, err
}

func secondsOr(v int32, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

func orDefault(v, def int32) int32 {
	if v <= 0 {
		return def
	}
	return v
}

// lockedBuffer takes both output streams of an exec probe, which are copied concurrently.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
