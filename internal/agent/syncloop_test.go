package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// counter counts what the loop adds to a metric.
type counter struct {
	prometheus.Counter
	n atomic.Int64
}

func (c *counter) Inc() { c.n.Add(1) }

type fakeCompactor struct{ pending atomic.Bool }

func (c *fakeCompactor) CompactionPending() bool { return c.pending.Load() }

func (c *fakeCompactor) Compact(context.Context) (dataplane.SyncResult, error) {
	c.pending.Store(false)
	return dataplane.SyncResult{Operations: 1}, nil
}

// scriptedFeature is a loopFeature whose syncs the test answers one by one.
type scriptedFeature struct {
	clock   *testingclock.FakeClock
	syncs   chan syncCall
	results chan error
	// idle receives after each sync once the loop has set its timers and goes back to waiting:
	// resyncEvery is the last thing it asks before it waits.
	idle   chan struct{}
	synced atomic.Bool // a sync ran since the last idle
	drift  atomic.Bool
}

type syncCall struct {
	full bool
	at   time.Time // the loop's clock when the sync began
}

func newScriptedFeature(c *testingclock.FakeClock) *scriptedFeature {
	return &scriptedFeature{clock: c, syncs: make(chan syncCall), results: make(chan error), idle: make(chan struct{}, 1)}
}

func (f *scriptedFeature) sync(_ context.Context, full bool, _ time.Time) error {
	f.syncs <- syncCall{full, f.clock.Now()}
	f.synced.Store(true)
	return <-f.results
}

func (f *scriptedFeature) verify(context.Context) error {
	if f.drift.Swap(false) {
		return errors.New("rules changed")
	}
	return nil
}

func (f *scriptedFeature) resyncEvery() time.Duration {
	if f.synced.Swap(false) {
		f.idle <- struct{}{}
	}
	return time.Minute
}

// next waits for the loop's next sync (no timer needs to fire for it to come).
func (f *scriptedFeature) next(t *testing.T) syncCall {
	t.Helper()
	select {
	case c := <-f.syncs:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no sync")
	}
	return syncCall{}
}

// answer has the sync return err and waits until the loop waits again.
func (f *scriptedFeature) answer(t *testing.T, err error) {
	t.Helper()
	f.results <- err
	select {
	case <-f.idle:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not go back to waiting")
	}
}

// testStatus is a statusSink that keeps what the loop reports.
type testStatus struct {
	fs    statusapi.FeatureStatus
	ready int
}

func (s *testStatus) update(fn func(*statusapi.FeatureStatus)) { fn(&s.fs) }
func (s *testStatus) becameReady()                             { s.ready++ }

// TestSyncLoop walks the loop both features share through its cases on a fake clock: a failed
// first sync is retried whole after the backoff and the feature is ready (other backends
// retired once) when one succeeds; drift found at the resync is repaired with a full sync and
// counted once restored; deferred removals are compacted once quiet; a sync with nothing to
// apply is neither retried nor counted as failed; and an error from stop ends the loop.
func TestSyncLoop(t *testing.T) {
	var logs bytes.Buffer
	clk := testingclock.NewFakeClock(time.Unix(1_000_000, 0))
	f := newScriptedFeature(clk)
	status := &testStatus{}
	retired := 0
	compactor := &fakeCompactor{}
	syncErrors, driftRepairs, compactions := &counter{}, &counter{}, &counter{}
	l := newSyncLoop(&syncLoop{
		feature: f, status: status, log: slog.New(slog.NewTextHandler(&logs, nil)), clock: clk,
		name: "test", backend: "fake",
		metrics: loopMetrics{syncErrors: syncErrors, driftRepairs: driftRepairs, compactions: compactions,
			foreignChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"feature", "outcome"})},
		retireOthers: func(context.Context) error { retired++; return nil },
		compactor:    compactor, compactDelay: time.Second,
		failedMsg: "test sync failed", repairMsg: "test repairing",
	})
	stop := make(chan error, 1)
	done := make(chan error, 1)
	go func() { done <- l.run(context.Background(), stop) }()

	// waiters checks the timers the loop waits on besides its resync ticker.
	waiters := func(want int, what string) {
		t.Helper()
		if got := clk.Waiters() - 1; got != want {
			t.Fatalf("%s: the loop waits on %d timers besides the resync, want %d", what, got, want)
		}
	}
	if c := f.next(t); !c.full {
		t.Fatal("the first sync is not full")
	}
	f.answer(t, errors.New("kernel said no"))
	waiters(1, "after a failed sync") // the retry
	if status.ready != 0 || status.fs.LastError != "kernel said no" {
		t.Fatalf("after a failed first sync: ready %d, status %+v", status.ready, status.fs)
	}
	clk.Step(99 * time.Millisecond)
	waiters(1, "before the backoff ran out")
	clk.Step(time.Millisecond)
	if c := f.next(t); !c.full {
		t.Fatal("the retry of a failed first sync is not full")
	}
	f.answer(t, nil)
	waiters(0, "after a successful sync")
	if status.ready != 1 || retired != 1 {
		t.Fatalf("ready %d times, other backends retired %d times; want once each", status.ready, retired)
	}

	// Drift, found at the resync, with removals left to compact by the repair.
	f.drift.Store(true)
	compactor.pending.Store(true)
	clk.Step(time.Minute)
	if c := f.next(t); !c.full {
		t.Fatal("the repair of drift is not a full sync")
	}
	f.answer(t, nil)
	waiters(1, "after a sync that left removals") // the compaction
	if status.fs.Repairs != 1 || !status.fs.CompactionPending {
		t.Fatalf("status %+v, want 1 repair and compaction pending", status.fs)
	}
	clk.Step(time.Second)
	// The compaction runs in the loop; a change after it shows that it is done.
	l.notify()
	if c := f.next(t); c.full {
		t.Fatal("a change after a repair was synced whole")
	}
	f.answer(t, errIdle)
	waiters(0, "after a sync with nothing to apply") // no retry
	if compactor.pending.Load() || status.fs.CompactionPending {
		t.Errorf("deferred removals were not compacted (status %+v)", status.fs)
	}
	l.notify()
	if c := f.next(t); c.full {
		t.Fatal("a change was synced whole")
	}
	f.answer(t, nil)
	stop <- errors.New("watch failed")
	if err := <-done; err == nil || err.Error() != "watch failed" {
		t.Fatalf("run returned %v, want the error from stop", err)
	}

	if status.ready != 1 || retired != 1 {
		t.Errorf("ready %d times, other backends retired %d times; want once each", status.ready, retired)
	}
	if status.fs.Repairs != 1 || status.fs.LastError != "kernel said no" || status.fs.CompactionPending {
		t.Errorf("status %+v, want 1 repair, the failure as LastError, no compaction pending", status.fs)
	}
	if syncErrors.n.Load() != 1 || driftRepairs.n.Load() != 1 || compactions.n.Load() != 1 {
		t.Errorf("%d sync errors, %d drift repairs, %d compactions; want 1 each", syncErrors.n.Load(), driftRepairs.n.Load(), compactions.n.Load())
	}
	for _, want := range []string{`msg="test sync failed"`, `msg="test repairing"`, `msg="compacted:`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs.String())
		}
	}
}

// TestSyncLoopCoalescesOnlyBursts: a change that finds the loop idle is synced at once, even
// right after a sync; changes that come while a sync runs wait out minInterval, so that a
// burst goes into few transactions.
func TestSyncLoopCoalescesOnlyBursts(t *testing.T) {
	const minInterval = 400 * time.Millisecond
	clk := testingclock.NewFakeClock(time.Unix(1_000_000, 0))
	f := newScriptedFeature(clk)
	l := newSyncLoop(&syncLoop{
		feature: f, status: &testStatus{}, log: slog.New(slog.DiscardHandler), clock: clk,
		name: "test", backend: "fake", minInterval: minInterval,
		metrics: loopMetrics{syncErrors: &counter{}, driftRepairs: &counter{}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = l.run(ctx, nil) }()

	first := f.next(t) // the initial full sync
	f.answer(t, nil)
	// Idle: the loop finished the first sync; this change must not wait for minInterval.
	l.notify()
	second := f.next(t)
	if d := second.at.Sub(first.at); d != 0 {
		t.Fatalf("a change on an idle loop waited %v", d)
	}
	// A burst: a change arrives while the sync it caused runs; the next sync waits.
	l.notify()
	f.answer(t, nil)
	third := f.next(t)
	if d := third.at.Sub(second.at); d < minInterval {
		t.Fatalf("a change that came during a sync was synced %v after it began, want at least %v", d, minInterval)
	}
	f.results <- nil
}
