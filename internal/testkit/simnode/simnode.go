// Package simnode runs the real netwarden agent binary against a testbed node: it writes the
// cluster state as manifests, starts the agent inside the node's network namespace, waits for
// it to apply each change, and probes reachability. End-to-end tests and the demo share it.
package simnode

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/agent"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
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
	// sockDir holds the unix socket of the agent's health server, through which Status reads
	// what the agent has applied: a unix socket is reachable from outside the node's netns.
	sockDir string
	// healthAddr is where the running agent serves its health endpoints: unix:PATH, or
	// HOST:PORT inside the node netns.
	healthAddr string
	// wrote maps each manifest file this Sim wrote to the hex SHA-256 of its content, or to ""
	// once removed: the agent has applied the writes when its Revision agrees.
	wrote map[string]string

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
	sockDir, err := os.MkdirTemp("", "netwarden-sock-")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	bed, err := testbed.New(opts.Bed)
	if err != nil {
		os.RemoveAll(dir)
		os.RemoveAll(sockDir)
		return nil, err
	}
	return &Sim{Bed: bed, Dir: dir, NodeName: opts.NodeName, bin: bin, sockDir: sockDir, wrote: map[string]string{}}, nil
}

// Close stops the agent and removes the namespaces and the manifests directory.
func (s *Sim) Close() error {
	s.StopAgent()
	for _, c := range s.closers {
		c.Close()
	}
	err := s.Bed.Close()
	os.RemoveAll(s.Dir)
	os.RemoveAll(s.sockDir)
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
// reads a half-written file. WaitApplied then waits for this content.
func (s *Sim) WriteFile(name string, data []byte) error {
	tmp := filepath.Join(s.Dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, name)); err != nil {
		return err
	}
	s.mu.Lock()
	s.wrote[name] = ContentHash(data)
	s.mu.Unlock()
	return nil
}

// RemoveFile removes file name from the manifests directory. WaitApplied then waits for the
// agent to have applied a state without it.
func (s *Sim) RemoveFile(name string) error {
	if err := os.Remove(filepath.Join(s.Dir, name)); err != nil {
		return err
	}
	s.mu.Lock()
	s.wrote[name] = ""
	s.mu.Unlock()
	return nil
}

// Written returns the files this Sim wrote, each with the ContentHash of its latest content
// ("" once removed), for checking another agent's status with Covers.
func (s *Sim) Written() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.wrote)
}

// ContentHash spells the hash of a manifest file's content as the agent's Revision does.
func ContentHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
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
// the health server on a unix socket (see Status), and the given flags (which must name a
// state source).
func (s *Sim) StartAgentArgs(flags ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent != nil {
		return errors.New("agent already running")
	}
	args := append([]string{"netns", "exec", s.Bed.NodeNetNSName(), s.bin, "agent",
		"--node-name", s.NodeName, "--health-addr", "unix:" + s.StatusSocket(), "--log-level", "debug"}, flags...)
	// A test that chooses the health address itself (to check the TCP endpoint) gets its
	// status read there.
	s.healthAddr = "unix:" + s.StatusSocket()
	for i, f := range flags {
		if v, ok := strings.CutPrefix(f, "--health-addr="); ok {
			s.healthAddr = v
		} else if f == "--health-addr" && i+1 < len(flags) {
			s.healthAddr = flags[i+1]
		}
	}
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

// WaitLogged waits until the agent's log holds every one of want, and returns the first of
// them still missing at the deadline ("" when all arrived). The status can report an event
// before the agent's line about it has come through the pipe, so a check that follows a
// status wait must not read the log only once.
func (s *Sim) WaitLogged(timeout time.Duration, want ...string) string {
	deadline := time.Now().Add(timeout)
	for {
		log := s.Log()
		missing := ""
		for _, w := range want {
			if !strings.Contains(log, w) {
				missing = w
				break
			}
		}
		if missing == "" || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StatusSocket is the unix socket the agent started by StartAgent serves its health
// endpoints on.
func (s *Sim) StatusSocket() string { return filepath.Join(s.sockDir, "agent.sock") }

// Status reads the agent's /status, its Revisions limited to the files this Sim wrote (the
// hashes of thousands of files it did not write would be megabytes of JSON per read).
func (s *Sim) Status() (agent.Status, error) { return s.statusChangedFrom(nil, 0, nil) }

// statusChangedFrom reads the agent's /status like Status, its Revisions' resourceVersions
// limited to resources. With seen, the status the caller read last, the agent answers once its
// status has changed from that one, or after wait.
func (s *Sim) statusChangedFrom(seen *agent.Status, wait time.Duration, resources []string) (agent.Status, error) {
	s.mu.Lock()
	files := []string{""} // no file has this name: none, when the Sim wrote none
	for f := range s.wrote {
		files = append(files, f)
	}
	addr := s.healthAddr
	s.mu.Unlock()
	q := statusQuery(files, resources, seen, wait)
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return readStatus(func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}, q, wait)
	}
	return readStatus(func(ctx context.Context) (net.Conn, error) {
		var conn net.Conn
		err := s.Bed.InNode(func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return conn, err
	}, q, wait)
}

// ReadStatus reads /status from the agent serving on the unix socket sock, its Revisions
// limited to the named files and resources.
func ReadStatus(sock string, files, resources []string) (agent.Status, error) {
	return readStatus(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, statusQuery(files, resources, nil, 0), 0)
}

// statusQuery is the query of a /status read: the Revision entries wanted and, with seen, a
// long poll for a change from it.
func statusQuery(files, resources []string, seen *agent.Status, wait time.Duration) url.Values {
	q := url.Values{"file": files, "resource": resources}
	if seen != nil {
		q.Set("after", strconv.FormatUint(seen.Version, 10))
		q.Set("wait", wait.String())
	}
	return q
}

func readStatus(dial func(context.Context) (net.Conn, error), q url.Values, wait time.Duration) (agent.Status, error) {
	var st agent.Status
	c := http.Client{Timeout: wait + 5*time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
	}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://agent/status?" + q.Encode())
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Applied reports whether every enabled feature's rules come from a state that holds the
// latest content of every file this Sim wrote (and none it removed).
func (s *Sim) Applied(st agent.Status) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Covers(st, s.wrote)
}

// Covers reports whether each feature in st has applied a state holding exactly the given file
// contents (name to ContentHash; "" for a removed file). A feature that has not synced yet
// covers nothing.
func Covers(st agent.Status, files map[string]string) bool {
	return everyFeature(st, func(fs *agent.FeatureStatus) bool {
		for name, want := range files {
			if got, _ := fs.Revision.Files.Get(name); got != want {
				return false
			}
		}
		return true
	})
}

// CoversResource reports whether each feature in st has applied a state holding the write of
// resource at resourceVersion rv (the API source).
func CoversResource(st agent.Status, resource string, rv uint64) bool {
	return everyFeature(st, func(fs *agent.FeatureStatus) bool { return fs.Revision.Covers(resource, rv) })
}

// everyFeature reports whether st has an enabled feature and every enabled one has synced and
// passes applied.
func everyFeature(st agent.Status, applied func(*agent.FeatureStatus) bool) bool {
	for _, fs := range []*agent.FeatureStatus{st.NetworkPolicy, st.Masquerade} {
		if fs != nil && (fs.Generation == 0 || !applied(fs)) {
			return false
		}
	}
	return st.NetworkPolicy != nil || st.Masquerade != nil
}

// WaitApplied waits until the agent has applied the latest content of every file this Sim
// wrote: read from its status, never guessed from its log or from time.
func (s *Sim) WaitApplied(timeout time.Duration) error {
	return s.WaitStatus(timeout, "the files written", s.Applied)
}

// WaitEstablished waits until the agent has applied the files written and re-judged established
// flows by their rules (see agent.FeatureStatus.EstablishedGeneration): a flow they deny is
// stopped from then on.
func (s *Sim) WaitEstablished(timeout time.Duration) error {
	return s.WaitStatus(timeout, "the files written, established flows included", s.Settled)
}

// Settled reports whether st covers the files written, established flows included.
func (s *Sim) Settled(st agent.Status) bool {
	if !s.Applied(st) {
		return false
	}
	p := st.NetworkPolicy
	return p == nil || p.EstablishedGeneration >= p.Generation
}

// WaitResource waits until the agent (from the API source) has applied the write of resource
// at resourceVersion rv.
func (s *Sim) WaitResource(timeout time.Duration, resource string, rv uint64) error {
	return s.waitStatus(timeout, fmt.Sprintf("%s at resourceVersion %d", resource, rv), []string{resource}, func(st agent.Status) bool {
		return CoversResource(st, resource, rv)
	})
}

// WaitStatus reads the agent's status until done holds, each read after the first a long
// poll answered when the status changes: it sees each change as soon as the agent makes it,
// without spending the agent's CPU on polls. It fails early when the agent exits, and the
// error shows the last status and the end of the log.
func (s *Sim) WaitStatus(timeout time.Duration, what string, done func(agent.Status) bool) error {
	return s.waitStatus(timeout, what, nil, done)
}

// waitStatus is WaitStatus reading the resourceVersions of resources too.
func (s *Sim) waitStatus(timeout time.Duration, what string, resources []string, done func(agent.Status) bool) error {
	deadline := time.Now().Add(timeout)
	var last agent.Status
	var seen *agent.Status // the last status read, to wait for a change from
	var lastErr error
	for {
		var st agent.Status
		var err error
		asked := time.Now()
		wait := min(time.Second, max(time.Until(deadline), 0)) // short enough to notice an exited agent or the deadline soon
		if seen == nil {
			st, err = s.statusChangedFrom(nil, 0, resources)
		} else {
			st, err = s.statusChangedFrom(seen, wait, resources)
			if err == nil && st.Version == seen.Version && time.Since(asked) < wait/2 {
				// An agent without the long poll (an older binary, measured side by side)
				// answers at once: poll it at the interval of old rather than spin.
				time.Sleep(250 * time.Microsecond)
			}
		}
		if err == nil && done(st) {
			return nil
		}
		last, lastErr = st, err
		if err == nil {
			seen = &last
		}
		s.mu.Lock()
		exited := s.exited
		running := s.agent != nil
		s.mu.Unlock()
		if !running {
			return fmt.Errorf("waiting for the agent to apply %s: no agent running", what)
		}
		select {
		case <-exited:
			return fmt.Errorf("agent exited before applying %s:\n%s", what, tailLines(s.Log(), 40))
		default:
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(last, "", "  ")
			return fmt.Errorf("agent did not apply %s within %s (last status error %v):\n%s\nlog:\n%s", what, timeout, lastErr, b, tailLines(s.Log(), 40))
		}
		if err != nil {
			// Not serving yet (starting), or gone: a poll interval, not a guess at sync time.
			seen = nil
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Apply writes the state and waits for the agent to apply it.
func (s *Sim) Apply(objs ...runtime.Object) error {
	if err := s.SetState(objs...); err != nil {
		return err
	}
	return s.WaitApplied(15 * time.Second)
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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

var backendWrappers struct {
	sync.Mutex
	paths map[string]string
}

// BackendBinary returns a wrapper around the agent binary (AgentBinary) that selects a backend
// for the agent and render commands (--backend flag; a later --backend on the command line
// still wins) and pins the iptables variant ($NETWARDEN_IPTABLES_MODE=mode, empty for any), so
// that every way a test starts the binary uses that backend. Wrappers are made once per
// process, in a temporary directory.
func BackendBinary(flag, mode string) (string, error) {
	bin, err := AgentBinary()
	if err != nil {
		return "", err
	}
	backendWrappers.Lock()
	defer backendWrappers.Unlock()
	key := flag + "/" + mode
	if p, ok := backendWrappers.paths[key]; ok {
		return p, nil
	}
	dir, err := os.MkdirTemp("", "netwarden-bin-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "netwarden-"+flag+"-"+mode)
	script := fmt.Sprintf(`#!/bin/sh
export NETWARDEN_IPTABLES_MODE=%q
case "$1" in
agent|render) cmd=$1; shift; exec %q "$cmd" --backend %q "$@" ;;
esac
exec %q "$@"
`, mode, bin, flag, bin)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return "", err
	}
	if backendWrappers.paths == nil {
		backendWrappers.paths = map[string]string{}
	}
	backendWrappers.paths[key] = path
	return path, nil
}
