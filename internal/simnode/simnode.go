// Package simnode runs the real netwarden agent binary against a testbed node: it writes the
// cluster state as manifests, starts the agent inside the node's network namespace, waits for
// it to apply each change, and probes reachability. End-to-end tests and the demo share it.
package simnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/testbed"
)

// Options configure a Sim.
type Options struct {
	Bed testbed.Config
	// NodeName is this node's name in the cluster state; default "node-1".
	NodeName string
	// AgentBin is the netwarden binary; default $NETWARDEN_BIN, then "netwarden" in PATH.
	AgentBin string
}

// Sim is one simulated node running the agent.
type Sim struct {
	Bed      *testbed.Bed
	Dir      string // the manifests directory the agent watches
	NodeName string
	bin      string

	mu      sync.Mutex
	agent   *exec.Cmd
	log     bytes.Buffer
	exited  chan struct{}
	waitErr error
	closers []io.Closer
}

// AgentBinary finds the agent binary for tests.
func AgentBinary() (string, error) {
	if b := os.Getenv("NETWARDEN_BIN"); b != "" {
		return b, nil
	}
	if b, err := exec.LookPath("netwarden"); err == nil {
		return b, nil
	}
	return "", errors.New("netwarden binary not found: set NETWARDEN_BIN (make test does) or run make build")
}

// New creates the test bed and an empty manifests directory.
func New(opts Options) (*Sim, error) {
	if opts.NodeName == "" {
		opts.NodeName = "node-1"
	}
	bin := opts.AgentBin
	if bin == "" {
		var err error
		if bin, err = AgentBinary(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "netwarden-manifests-")
	if err != nil {
		return nil, err
	}
	bed, err := testbed.New(opts.Bed)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Sim{Bed: bed, Dir: dir, NodeName: opts.NodeName, bin: bin}, nil
}

// Close stops the agent and removes the namespaces and the manifests directory.
func (s *Sim) Close() error {
	s.StopAgent()
	for _, c := range s.closers {
		c.Close()
	}
	err := s.Bed.Close()
	os.RemoveAll(s.Dir)
	return err
}

// AddPod creates a pod network namespace and returns the Pod object describing it, scheduled
// on this node, Running, with the IPs the test bed gave it.
func (s *Sim) AddPod(namespace, name string, labels map[string]string, ports ...corev1.ContainerPort) (*corev1.Pod, *testbed.Pod, error) {
	tp, err := s.Bed.AddPod(namespace, name)
	if err != nil {
		return nil, nil, err
	}
	return PodObject(namespace, name, s.NodeName, labels, tp.IPs(), ports...), tp, nil
}

// PodObject builds a running Pod object with the given IPs.
func PodObject(namespace, name, node string, labels map[string]string, ips []netip.Addr, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "example.invalid/server", Ports: ports}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0].String()
	}
	return p
}

// Namespace builds a Namespace object.
func Namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}
}

// Marshal renders objects as one multi-document YAML stream.
func Marshal(objs ...runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// WriteFile atomically replaces file name in the manifests directory, so the agent never
// reads a half-written file.
func (s *Sim) WriteFile(name string, data []byte) error {
	tmp := filepath.Join(s.Dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.Dir, name))
}

// SetState writes the whole cluster state as one file, so the agent sees each step as one change.
func (s *Sim) SetState(objs ...runtime.Object) error {
	data, err := Marshal(objs...)
	if err != nil {
		return err
	}
	return s.WriteFile("cluster.yaml", data)
}

// StartAgent runs `netwarden agent --manifests` inside the node netns with extra flags.
func (s *Sim) StartAgent(extra ...string) error {
	return s.StartAgentArgs(append([]string{"--manifests", s.Dir}, extra...)...)
}

// StartAgentArgs runs `netwarden agent` inside the node netns with the node name, debug logs,
// no health server, and the given flags (which must name a state source).
func (s *Sim) StartAgentArgs(flags ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent != nil {
		return errors.New("agent already running")
	}
	args := append([]string{"netns", "exec", s.Bed.NodeNetNSName(), s.bin, "agent",
		"--node-name", s.NodeName, "--health-addr", "", "--log-level", "debug"}, flags...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout = &lockedWriter{mu: &s.mu, w: &s.log}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting agent: %w", err)
	}
	s.agent = cmd
	s.exited = make(chan struct{})
	go func(exited chan struct{}) {
		err := cmd.Wait()
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		close(exited)
	}(s.exited)
	return nil
}

// StopAgent sends SIGTERM and waits; the rules stay in the kernel.
func (s *Sim) StopAgent() error {
	s.mu.Lock()
	cmd, exited := s.agent, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.agent = nil
	return s.waitErr
}

// AgentPID returns the running agent's process ID (ip netns exec replaces itself with the
// agent), or 0.
func (s *Sim) AgentPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent == nil {
		return 0
	}
	return s.agent.Process.Pid
}

// Log returns everything the agent printed so far.
func (s *Sim) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// Syncs counts the changes the agent has processed: applied ("synced") or found to need no
// kernel change ("no change").
func (s *Sim) Syncs() int {
	l := s.Log()
	return strings.Count(l, "msg=synced") + strings.Count(l, `msg="no change"`)
}

// WaitSyncs waits until the agent has processed more than after changes.
func (s *Sim) WaitSyncs(after int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if s.Syncs() > after {
			return nil
		}
		s.mu.Lock()
		exited := s.exited
		s.mu.Unlock()
		if exited != nil {
			select {
			case <-exited:
				return fmt.Errorf("agent exited:\n%s", s.Log())
			default:
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("agent did not sync within %s; log:\n%s", timeout, s.Log())
}

// Apply writes the state and waits for the agent to process it.
func (s *Sim) Apply(objs ...runtime.Object) error {
	before := s.Syncs()
	if err := s.SetState(objs...); err != nil {
		return err
	}
	return s.WaitSyncs(before, 15*time.Second)
}

// FlushConntrack forgets every tracked flow in the node netns. Policy changes apply to new
// connections; established ones (and UDP flows, which conntrack keeps for up to two minutes)
// stay allowed. Tests flush between steps so that a probe that happens to reuse a source port
// measures the new policy rather than an older flow.
func (s *Sim) FlushConntrack() error {
	out, err := exec.Command("ip", "netns", "exec", s.Bed.NodeNetNSName(), "conntrack", "-F").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "0 flow entries") {
		return fmt.Errorf("conntrack -F: %v: %s", err, out)
	}
	return nil
}

// ForwardFromNode makes addr (host:port on loopback) inside the node netns reach the same
// address in the test's own network namespace, so an agent in the node netns can talk to a
// kube-apiserver the test runs on loopback. It stops when the Sim closes.
func (s *Sim) ForwardFromNode(addr string) error {
	var ln net.Listener
	if err := s.Bed.InNode(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return fmt.Errorf("listening on %s in the node netns: %w", addr, err)
	}
	s.closers = append(s.closers, ln)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(out, in); done <- struct{}{} }()
				go func() { io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return nil
}

// Nft runs nft inside the node netns.
func (s *Sim) Nft(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", s.Bed.NodeNetNSName(), "nft"}, args...)...).CombinedOutput()
	return string(out), err
}

// RunAgent runs the agent binary once inside the node netns with the given arguments.
func (s *Sim) RunAgent(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", s.Bed.NodeNetNSName(), s.bin}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// RequireKernel skips the test (or fails it when $CI is set: CI must run everything) unless it
// can create network namespaces, program nftables and run the agent binary.
func RequireKernel(t testing.TB) {
	t.Helper()
	var why string
	switch {
	case os.Geteuid() != 0:
		why = "needs root for network namespaces and nftables"
	case !hasCmd("ip") || !hasCmd("nft"):
		why = "needs iproute2 and nftables (make deps installs them)"
	}
	if _, err := AgentBinary(); err != nil && why == "" {
		why = err.Error()
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("kernel test cannot run in CI: %s", why)
	}
	t.Skipf("skipping kernel test: %s", why)
}

func hasCmd(name string) bool { _, err := exec.LookPath(name); return err == nil }
