package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// syncLoop keeps one feature's rules in the kernel in step with its inputs. The NetworkPolicy
// and masquerade features each run one; what sets them apart comes in through the hooks and
// labels below, so that retries, repairs and readiness behave the same for both.
type syncLoop struct {
	a       *Agent
	feature string                    // as the warning of a failed retire names it
	backend string                    // the backend's Name(), for the compaction log
	status  **statusapi.FeatureStatus // the feature's entry on a.status
	// ready is set after the first successful sync, once retireOthers (when set) has run, so
	// that the old backend's rules judge traffic until the new ones do.
	ready        *atomic.Bool
	retireOthers func(context.Context) error

	// sync brings the kernel to the desired state: whole when full, else by difference. seen is
	// when the oldest change it covers was seen (zero if none), for the programming latency.
	// errIdle means nothing can be applied before the next change.
	sync func(ctx context.Context, full bool, seen time.Time) error
	// verify reports drift from what sync applied last.
	verify func(ctx context.Context) error
	// minInterval coalesces bursts of events: when changes came while a sync ran, the next
	// one starts at least this long after it began.
	minInterval time.Duration
	// resyncEvery is how often verify runs, asked after every sync so it may follow a config.
	resyncEvery func() time.Duration
	// compactor, when set, has its deferred removals applied once no change came for compactDelay.
	compactor    dataplane.Compactor
	compactDelay time.Duration

	syncErrors, driftRepairs prometheus.Counter
	failedMsg, repairMsg     string // the log messages of a failed sync and of drift found

	trigger chan struct{}
	// check asks for a verify now: the kernel reported another process's commit to the
	// feature's tables (see watch.go).
	check chan struct{}
	// foreignChanges counts those commits by outcome.
	foreignChanges *prometheus.CounterVec
	// lastEvent is when the oldest unprocessed change was seen (Unix ns; 0 when none).
	lastEvent atomic.Int64
}

// errIdle is what a sync hook returns when it has nothing to apply until its inputs change (an
// invalid masquerade config): the loop neither retries nor counts a failure.
var errIdle = errors.New("nothing to apply until the next change")

func (l *syncLoop) notify() {
	l.lastEvent.CompareAndSwap(0, time.Now().UnixNano())
	select {
	case l.trigger <- struct{}{}:
	default:
	}
}

// kernelChanged asks the loop to verify the kernel now.
func (l *syncLoop) kernelChanged() {
	select {
	case l.check <- struct{}{}:
	default:
	}
}

// run syncs until ctx is done, or until stop delivers an error, which it returns.
func (l *syncLoop) run(ctx context.Context, stop <-chan error) error {
	interval := l.resyncEvery()
	resync := time.NewTicker(interval)
	defer resync.Stop()
	retry := time.NewTimer(0)
	<-retry.C
	backoff := time.Duration(0)
	compact := time.NewTimer(0)
	<-compact.C

	// The first sync replaces the rules whole: it converges from whatever an earlier agent
	// left in the kernel in one atomic step.
	full := true
	pending := true
	repairing := false // the pending full sync restores rules someone else changed
	var lastSync time.Time
	// burst is set when a change came while the last sync ran: changes are coming faster
	// than they are applied, and the next sync waits out minInterval to take more at once.
	burst := false
	for {
		if pending {
			pending = false
			lastSync = time.Now()
			err := l.syncOnce(ctx, full)
			burst = len(l.trigger) > 0
			switch {
			case errors.Is(err, errIdle):
				// The change that makes it possible will wake the loop.
			case err != nil:
				l.syncErrors.Inc()
				l.a.status.update(l.status, func(fs *statusapi.FeatureStatus) { fs.LastError = err.Error() })
				backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
				l.a.log.Error(l.failedMsg, "err", err, "retryIn", backoff)
				retry.Reset(backoff)
			default:
				l.a.kernelWritten()
				if repairing {
					l.a.status.update(l.status, func(fs *statusapi.FeatureStatus) { fs.Repairs++ })
				}
				full, backoff, repairing = false, 0, false
				if !l.ready.Load() {
					// Ready (on /readyz and /status) only once the other backends' rules are
					// gone too, as the "ready" log line always said.
					l.a.retire(l.feature, l.retireOthers, ctx)
					l.a.featureReady(l.ready)
				}
				if l.compactor != nil && l.compactor.CompactionPending() {
					compact.Reset(l.compactDelay)
					l.a.status.update(l.status, func(fs *statusapi.FeatureStatus) { fs.CompactionPending = true })
				}
			}
			if d := l.resyncEvery(); d != interval {
				interval = d
				resync.Reset(interval)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-stop:
			if ctx.Err() != nil {
				return nil
			}
			return err
		case <-l.trigger:
			// Events that keep coming are coalesced into one transaction per interval; one
			// that finds the loop idle waits for nothing.
			if d := time.Until(lastSync.Add(l.minInterval)); burst && d > 0 {
				time.Sleep(d)
			}
			pending = true
		case <-retry.C:
			pending = true
		case <-compact.C:
			if err := l.compact(ctx); err != nil {
				l.a.log.Error("compaction failed; replacing the rules whole", "err", err)
				full, pending = true, true
			}
		case <-l.check:
			if pending || repairing || full {
				break // a full sync is coming anyway
			}
			drifted := l.drifted(ctx, "another process changed the kernel's tables")
			if l.foreignChanges != nil {
				l.foreignChanges.WithLabelValues(l.feature, map[bool]string{true: "repaired", false: "intact"}[drifted]).Inc()
			}
			if drifted {
				full, pending, repairing = true, true, true
			}
		case <-resync.C:
			if l.drifted(ctx, "resync period") {
				full, pending, repairing = true, true, true
			}
		}
	}
}

// drifted runs verify, and logs and counts the drift it finds; trigger says what asked.
func (l *syncLoop) drifted(ctx context.Context, trigger string) bool {
	err := l.verify(ctx)
	if err != nil {
		l.a.log.Warn(l.repairMsg, "reason", err, "trigger", trigger)
		l.driftRepairs.Inc()
	}
	return err != nil
}

// syncOnce runs the sync hook for the changes seen so far.
func (l *syncLoop) syncOnce(ctx context.Context, full bool) error {
	seen := l.lastEvent.Swap(0)
	var since time.Time
	if seen != 0 {
		since = time.Unix(0, seen)
	}
	err := l.sync(ctx, full, since)
	if err != nil && !errors.Is(err, errIdle) {
		// The kernel does not hold these changes yet: their latency runs on to the retry.
		l.lastEvent.CompareAndSwap(0, seen)
	}
	return err
}

// compact applies the compactor's deferred removals, unless a sync since did.
func (l *syncLoop) compact(ctx context.Context) error {
	if !l.compactor.CompactionPending() {
		return nil
	}
	start := time.Now()
	res, err := l.compactor.Compact(ctx)
	if err != nil {
		l.syncErrors.Inc()
		return err
	}
	l.a.kernelWritten()
	l.a.metrics.compactions.Inc()
	l.a.status.update(l.status, func(fs *statusapi.FeatureStatus) { fs.CompactionPending = l.compactor.CompactionPending() })
	l.a.log.Info("compacted: removed what earlier changes left unreachable", "backend", l.backend,
		"operations", res.Operations, "full", res.Full, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// syncedAttrs adds to the attributes of a "synced" log line how long ago the change was seen
// and why an incremental sync fell back to a full one.
func syncedAttrs(attrs []any, seen time.Time, res dataplane.SyncResult) []any {
	if !seen.IsZero() {
		attrs = append(attrs, "sinceEvent", time.Since(seen).Round(time.Microsecond))
	}
	if res.Fallback != "" {
		attrs = append(attrs, "fallbackReason", res.Fallback)
	}
	return attrs
}
