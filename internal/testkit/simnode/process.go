package simnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

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

// RunAgent runs the agent binary once inside the node netns with the given arguments.
func (s *Sim) RunAgent(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", s.Bed.NodeNetNSName(), s.bin}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
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

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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
