package simnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/netwarden/netwarden/internal/statusapi"
)

// StatusSocket is the unix socket the agent started by StartAgent serves its health
// endpoints on.
func (s *Sim) StatusSocket() string { return filepath.Join(s.sockDir, "agent.sock") }

// Status reads the agent's /status, its Revisions limited to the files this Sim wrote (the
// hashes of thousands of files it did not write would be megabytes of JSON per read).
func (s *Sim) Status() (statusapi.Status, error) { return s.statusClient().Read(s.statusQuery(nil)) }

// statusClient reads the status where the running agent serves it: on the unix socket, or on
// the TCP address a test chose, which is inside the node netns.
func (s *Sim) statusClient() statusapi.Client {
	return statusapi.Client{Dial: func(ctx context.Context) (net.Conn, error) {
		s.mu.Lock()
		addr := s.healthAddr
		s.mu.Unlock()
		if path, ok := strings.CutPrefix(addr, "unix:"); ok {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		var conn net.Conn
		err := s.Bed.InNode(func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return conn, err
	}}
}

// statusQuery limits a status read to the files this Sim wrote and to resources.
func (s *Sim) statusQuery(resources []string) statusapi.Query {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := []string{""} // no file has this name: none, when the Sim wrote none
	for f := range s.wrote {
		files = append(files, f)
	}
	return statusapi.Query{Files: files, Resources: resources}
}

// Applied reports whether every enabled feature's rules come from a state that holds the
// latest content of every file this Sim wrote (and none it removed).
func (s *Sim) Applied(st statusapi.Status) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return statusapi.Covers(st, s.wrote)
}

// WaitApplied waits until the agent has applied the latest content of every file this Sim
// wrote: read from its status, never guessed from its log or from time.
func (s *Sim) WaitApplied(timeout time.Duration) error {
	return s.WaitStatus(timeout, "the files written", s.Applied)
}

// WaitEstablished waits until the agent has applied the files written and re-judged established
// flows by their rules (see statusapi.FeatureStatus.EstablishedGeneration): a flow they deny is
// stopped from then on.
func (s *Sim) WaitEstablished(timeout time.Duration) error {
	return s.WaitStatus(timeout, "the files written, established flows included", s.Settled)
}

// Settled reports whether st covers the files written, established flows included.
func (s *Sim) Settled(st statusapi.Status) bool {
	if !s.Applied(st) {
		return false
	}
	p := st.NetworkPolicy
	return p == nil || p.EstablishedGeneration >= p.Generation
}

// WaitResource waits until the agent (from the API source) has applied the write of resource
// at resourceVersion rv.
func (s *Sim) WaitResource(timeout time.Duration, resource string, rv uint64) error {
	return s.waitStatus(timeout, fmt.Sprintf("%s at resourceVersion %d", resource, rv), []string{resource}, func(st statusapi.Status) bool {
		return statusapi.CoversResource(st, resource, rv)
	})
}

// WaitStatus reads the agent's status until done holds, by long polls that see each change as
// soon as the agent makes it (statusapi.Client.Wait). It fails early when the agent exits, and
// the error shows the last status and the end of the log.
func (s *Sim) WaitStatus(timeout time.Duration, what string, done func(statusapi.Status) bool) error {
	return s.waitStatus(timeout, what, nil, done)
}

// waitStatus is WaitStatus reading the resourceVersions of resources too.
func (s *Sim) waitStatus(timeout time.Duration, what string, resources []string, done func(statusapi.Status) bool) error {
	query := func() statusapi.Query { return s.statusQuery(resources) }
	err := s.statusClient().Wait(time.Now().Add(timeout), query, done, func() error { return s.agentGone(what) })
	var late *statusapi.DeadlineError
	if errors.As(err, &late) {
		b, _ := json.MarshalIndent(late.Last, "", "  ")
		return fmt.Errorf("agent did not apply %s within %s (last status error %v):\n%s\nlog:\n%s", what, timeout, late.ReadErr, b, tailLines(s.Log(), 40))
	}
	return err
}

// agentGone says why waiting for the agent to apply what is in vain (no agent, or it exited),
// or returns nil.
func (s *Sim) agentGone(what string) error {
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
	return nil
}
