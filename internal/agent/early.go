package agent

import (
	"context"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// EarlySource is a cluster.Source started before the agent that uses it exists, so that its
// initial load (thousands of files to read and parse, or the API's lists) goes on while the
// caller sets up the backends: probing nft and the iptables variants costs a cold start some
// 150 ms, which would otherwise come before the load. The agent's Run attaches to it.
type EarlySource struct {
	src  cluster.Source
	done chan struct{}
	err  error

	mu     sync.Mutex
	notify func()
	missed bool // a change came before Run attached
}

var (
	_ cluster.Source     = (*EarlySource)(nil)
	_ cluster.NodeLister = (*EarlySource)(nil)
)

// StartEarly runs src until ctx is done. The context given to Run must end when ctx does (derive
// it from ctx).
func StartEarly(ctx context.Context, src cluster.Source) *EarlySource {
	e := &EarlySource{src: src, done: make(chan struct{})}
	go func() {
		e.err = src.Run(ctx, e.forward)
		close(e.done)
	}()
	return e
}

func (e *EarlySource) forward() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.notify == nil {
		e.missed = true
		return
	}
	e.notify()
}

// Run attaches notify (called at once if the state changed before) and blocks until the source
// stops or ctx is done.
func (e *EarlySource) Run(ctx context.Context, notify func()) error {
	e.mu.Lock()
	if e.notify != nil {
		e.mu.Unlock()
		return errors.New("early source: Run called twice")
	}
	e.notify = notify
	if e.missed {
		notify()
	}
	e.mu.Unlock()
	select {
	case <-e.done:
		if e.err == nil {
			// The source stops cleanly only when its context ends, which ctx derives from:
			// ctx ends too, perhaps an instant later (a parent closes its Done channel before
			// it cancels its children), and the caller must see it ended, not a source that
			// stopped on its own.
			<-ctx.Done()
		}
		return e.err
	case <-ctx.Done():
		return nil
	}
}

// HasSynced implements cluster.Source.
func (e *EarlySource) HasSynced() bool { return e.src.HasSynced() }

// Snapshot implements cluster.Source.
func (e *EarlySource) Snapshot() *cluster.State { return e.src.Snapshot() }

// Nodes implements cluster.NodeLister, through the source's own when it has one.
func (e *EarlySource) Nodes() (map[string]*corev1.Node, cluster.Revision) {
	if nl, ok := e.src.(cluster.NodeLister); ok {
		return nl.Nodes()
	}
	st := e.src.Snapshot()
	return st.Nodes, st.Revision
}
