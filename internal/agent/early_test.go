package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// runningSource notifies once at start, then whenever poke is sent, and fails when fail is.
type runningSource struct {
	synced atomic.Bool
	poke   chan struct{}
	fail   chan error
	state  *cluster.State
}

func (s *runningSource) Run(ctx context.Context, notify func()) error {
	s.synced.Store(true)
	notify()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-s.fail:
			return err
		case <-s.poke:
			notify()
		}
	}
}
func (s *runningSource) HasSynced() bool          { return s.synced.Load() }
func (s *runningSource) Snapshot() *cluster.State { return s.state }

func TestEarlySourceDeliversWhatCameBeforeRun(t *testing.T) {
	st := cluster.NewState()
	st.Nodes = map[string]*corev1.Node{"n1": {}}
	src := &runningSource{poke: make(chan struct{}), fail: make(chan error, 1), state: st}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := StartEarly(ctx, src)
	for !e.HasSynced() {
		time.Sleep(time.Millisecond)
	}
	if nodes, _ := e.Nodes(); len(nodes) != 1 {
		t.Fatalf("Nodes through a source without its own lister: %v", nodes)
	}
	notified := make(chan struct{}, 10)
	runErr := make(chan error, 1)
	go func() { runErr <- e.Run(ctx, func() { notified <- struct{}{} }) }()
	select {
	case <-notified:
	case <-time.After(10 * time.Second):
		t.Fatal("the change before Run was not delivered")
	}
	src.poke <- struct{}{}
	select {
	case <-notified:
	case <-time.After(10 * time.Second):
		t.Fatal("a change after Run was not delivered")
	}
	if err := e.Run(ctx, func() {}); err == nil {
		t.Fatal("a second Run was accepted")
	}
	src.fail <- errors.New("watch broke")
	select {
	case err := <-runErr:
		if err == nil || err.Error() != "watch broke" {
			t.Fatalf("Run returned %v, want the source's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when the source stopped")
	}
}

// TestEarlySourceStopsWithItsContext: a source that stops cleanly stopped because its context
// ended; Run returns then only once the caller's derived context has ended too (a parent's
// Done closes before its children are cancelled: an agent that looked in between saw a
// source stopped on its own, and failed its exit on SIGTERM).
func TestEarlySourceStopsWithItsContext(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	child, cancelChild := context.WithCancel(parent)
	defer cancelChild()
	// The source sees its context end; the caller's, in this test, ends later.
	e := StartEarly(parent, stoppedSource{})
	runErr := make(chan error, 1)
	go func() { runErr <- e.Run(child, func() {}) }()
	<-e.done
	select {
	case err := <-runErr:
		t.Fatalf("Run returned %v before the caller's context ended", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancelChild()
	if err := <-runErr; err != nil {
		t.Fatalf("Run returned %v", err)
	}
}

// stoppedSource stops at once, cleanly, as a source whose context ended does.
type stoppedSource struct{}

func (stoppedSource) Run(context.Context, func()) error { return nil }
func (stoppedSource) HasSynced() bool                   { return true }
func (stoppedSource) Snapshot() *cluster.State          { return cluster.NewState() }
