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

// TestSyncLoop walks the loop both features share through its cases: a failed first sync is
// retried whole and the feature is ready (other backends retired once) when one succeeds;
// drift is repaired with a full sync and counted once restored; deferred removals are
// compacted; a sync with nothing to apply is neither retried nor counted as failed; and an
// error from stop ends the loop.
func TestSyncLoop(t *testing.T) {
	var logs bytes.Buffer
	a := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	a.status.policy = &statusapi.FeatureStatus{}
	fulls, results := make(chan bool), make(chan error)
	var drift atomic.Bool
	var ready atomic.Bool
	retired := 0
	compactor := &fakeCompactor{}
	syncErrors, driftRepairs := &counter{}, &counter{}
	l := &syncLoop{
		a: a, feature: "test", backend: "fake", status: &a.status.policy,
		ready: &ready, retireOthers: func(context.Context) error { retired++; return nil },
		sync: func(_ context.Context, full bool, _ time.Time) error {
			fulls <- full
			return <-results
		},
		verify: func(context.Context) error {
			if drift.Swap(false) {
				return errors.New("rules changed")
			}
			return nil
		},
		resyncEvery: func() time.Duration { return 5 * time.Millisecond },
		compactor:   compactor, compactDelay: time.Millisecond,
		syncErrors: syncErrors, driftRepairs: driftRepairs,
		failedMsg: "test sync failed", repairMsg: "test repairing",
		trigger: make(chan struct{}, 1),
	}
	stop := make(chan error, 1)
	done := make(chan error, 1)
	go func() { done <- l.run(context.Background(), stop) }()

	// step waits for the loop's next sync, checks whether it is full, and has it return err.
	step := func(wantFull bool, err error) {
		t.Helper()
		select {
		case full := <-fulls:
			if full != wantFull {
				t.Fatalf("sync full=%v, want %v", full, wantFull)
			}
			results <- err
		case <-time.After(5 * time.Second):
			t.Fatal("no sync")
		}
	}
	step(true, errors.New("kernel said no"))
	step(true, nil)
	drift.Store(true)
	compactor.pending.Store(true)
	step(true, nil)
	l.notify()
	step(false, errIdle)
	select {
	case <-fulls:
		t.Fatal("a sync with nothing to apply was retried")
	case <-time.After(300 * time.Millisecond):
	}
	if compactor.pending.Load() {
		t.Error("deferred removals were not compacted")
	}
	l.notify()
	step(false, nil)
	stop <- errors.New("watch failed")
	if err := <-done; err == nil || err.Error() != "watch failed" {
		t.Fatalf("run returned %v, want the error from stop", err)
	}

	if !ready.Load() || retired != 1 {
		t.Errorf("ready %v, other backends retired %d times; want ready, once", ready.Load(), retired)
	}
	st := a.status.policy
	if st.Repairs != 1 || st.LastError != "kernel said no" || st.CompactionPending {
		t.Errorf("status %+v, want 1 repair, the failure as LastError, no compaction pending", st)
	}
	if syncErrors.n.Load() != 1 || driftRepairs.n.Load() != 1 {
		t.Errorf("%d sync errors, %d drift repairs; want 1 each", syncErrors.n.Load(), driftRepairs.n.Load())
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
	a := New(Config{Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))})
	a.status.policy = &statusapi.FeatureStatus{}
	const minInterval, syncTime = 400 * time.Millisecond, 50 * time.Millisecond
	starts := make(chan time.Time, 10)
	var ready atomic.Bool
	l := &syncLoop{
		a: a, feature: "test", backend: "fake", status: &a.status.policy, ready: &ready,
		sync: func(context.Context, bool, time.Time) error {
			starts <- time.Now()
			time.Sleep(syncTime)
			return nil
		},
		verify:      func(context.Context) error { return nil },
		minInterval: minInterval, resyncEvery: func() time.Duration { return time.Hour },
		syncErrors: &counter{}, driftRepairs: &counter{}, trigger: make(chan struct{}, 1),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = l.run(ctx, nil) }()
	next := func() time.Time {
		t.Helper()
		select {
		case s := <-starts:
			return s
		case <-time.After(5 * time.Second):
			t.Fatal("no sync")
		}
		return time.Time{}
	}
	first := next() // the initial full sync
	time.Sleep(syncTime + 20*time.Millisecond)
	// Idle: the loop finished the first sync; this change must not wait for minInterval.
	notified := time.Now()
	l.notify()
	second := next()
	if d := second.Sub(notified); d > minInterval/2 {
		t.Fatalf("a change on an idle loop waited %v (%v after the sync before)", d, second.Sub(first))
	}
	// A burst: a change arrives while the sync it caused runs; the next sync waits.
	time.Sleep(syncTime / 2)
	l.notify()
	third := next()
	if d := third.Sub(second); d < minInterval {
		t.Fatalf("a change that came during a sync was synced %v after it began, want at least %v", d, minInterval)
	}
}
