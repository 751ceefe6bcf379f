package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// loopFeature is what a sync loop keeps in the kernel: the NetworkPolicy rules or the
// masquerade rules. What sets the features apart is here; retries, repairs, coalescing and
// readiness are the loop's, the same for both.
type loopFeature interface {
	// sync brings the kernel to the desired state: whole when full, else by difference. seen is
	// when the oldest change it covers was seen (zero if none), for the programming latency.
	// errIdle means nothing can be applied before the next change.
	sync(ctx context.Context, full bool, seen time.Time) error
	// verify reports drift from what sync applied last.
	verify(ctx context.Context) error
	// resyncEvery is how often verify runs, asked after every sync so it may follow a config.
	resyncEvery() time.Duration
}

// statusSink is where a sync loop reports its feature's state: the feature's entry on the
// agent's status board.
type statusSink interface {
	update(func(*statusapi.FeatureStatus))
	// becameReady is told once, after the first successful sync and the retirement of other
	// backends' rules.
	becameReady()
}

// syncLoop keeps one feature's rules in the kernel in step with its inputs. It knows the
// feature, where to report, a logger and a clock, and nothing of the agent around it.
type syncLoop struct {
	feature loopFeature
	status  statusSink
	log     *slog.Logger
	clock   clock.WithTicker
	name    string // the feature's name, as logs and metrics spell it
	backend string // the backend's Name(), for the compaction log
	metrics loopMetrics
	// retireOthers runs before the feature is ready, after its first successful sync, so that
	// the old backend's rules judge traffic until the new ones do.
	retireOthers func(context.Context) error
	// written is told after the loop's own kernel writes, its compactions (the kernel watch's
	// own-writes baseline); nil when nothing listens. The feature's sync tells it itself, before
	// its status says the write is done.
	written func()
	// minInterval coalesces bursts of events: when changes came while a sync ran, the next
	// one starts at least this long after it began.
	minInterval time.Duration
	// compactor, when set, has its deferred removals applied once no change came for compactDelay.
	compactor    dataplane.Compactor
	compactDelay time.Duration

	failedMsg, repairMsg string // the log messages of a failed sync and of drift found

	trigger chan struct{}
	// check asks for a verify now: the kernel reported another process's commit to the
	// feature's tables (see watch.go).
	check chan struct{}
	// lastEvent is when the oldest unprocessed change was seen (Unix ns; 0 when none).
	lastEvent atomic.Int64
}

// errIdle is what a sync hook returns when it has nothing to apply until its inputs change (an
// invalid masquerade config): the loop neither retries nor counts a failure.
var errIdle = errors.New("nothing to apply until the next change")

// newSyncLoop completes l: its channels, and the real clock unless a test gave another.
func newSyncLoop(l *syncLoop) *syncLoop {
	if l.clock == nil {
		l.clock = clock.RealClock{}
	}
	l.trigger, l.check = make(chan struct{}, 1), make(chan struct{}, 1)
	return l
}

func (l *syncLoop) notify() {
	l.lastEvent.CompareAndSwap(0, l.clock.Now().UnixNano())
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

// stoppedTimer returns a timer that fires only once Reset.
func stoppedTimer(c clock.Clock) clock.Timer {
	t := c.NewTimer(time.Hour)
	t.Stop()
	return t
}

// run syncs until ctx is done, or until stop delivers an error, which it returns.
func (l *syncLoop) run(ctx context.Context, stop <-chan error) error {
	interval := l.feature.resyncEvery()
	resync := l.clock.NewTicker(interval)
	defer func() { resync.Stop() }()
	retry, compact := stoppedTimer(l.clock), stoppedTimer(l.clock)
	backoff := time.Duration(0)

	// The first sync replaces the rules whole: it converges from whatever an earlier agent
	// left in the kernel in one atomic step.
	full := true
	pending := true
	ready := false
	repairing := false // the pending full sync restores rules someone else changed
	var lastSync time.Time
	// burst is set when a change came while the last sync ran: changes are coming faster
	// than they are applied, and the next sync waits out minInterval to take more at once.
	burst := false
	for {
		if pending {
			pending = false
			lastSync = l.clock.Now()
			err := l.syncOnce(ctx, full)
			burst = len(l.trigger) > 0
			switch {
			case errors.Is(err, errIdle):
				// The change that makes it possible will wake the loop.
			case err != nil:
				l.metrics.syncErrors.Inc()
				l.status.update(func(fs *statusapi.FeatureStatus) { fs.LastError = err.Error() })
				backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
				l.log.Error(l.failedMsg, "err", err, "retryIn", backoff)
				retry.Reset(backoff)
			default:
				if repairing {
					l.status.update(func(fs *statusapi.FeatureStatus) { fs.Repairs++ })
				}
				full, backoff, repairing = false, 0, false
				if !ready {
					// Ready (on /readyz and /status) only once the other backends' rules are
					// gone too, as the "ready" log line always said.
					retire(ctx, l.log, l.name, l.retireOthers)
					ready = true
					l.status.becameReady()
				}
				if l.compactor != nil && l.compactor.CompactionPending() {
					compact.Reset(l.compactDelay)
					l.status.update(func(fs *statusapi.FeatureStatus) { fs.CompactionPending = true })
				}
			}
			if d := l.feature.resyncEvery(); d != interval {
				interval = d
				resync.Stop()
				resync = l.clock.NewTicker(interval)
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
			if d := lastSync.Add(l.minInterval).Sub(l.clock.Now()); burst && d > 0 {
				l.clock.Sleep(d)
			}
			pending = true
		case <-retry.C():
			pending = true
		case <-compact.C():
			if err := l.compact(ctx); err != nil {
				l.log.Error("compaction failed; replacing the rules whole", "err", err)
				full, pending = true, true
			}
		case <-l.check:
			if pending || repairing || full {
				break // a full sync is coming anyway
			}
			drifted := l.drifted(ctx, "another process changed the kernel's tables")
			l.metrics.foreignChanges.WithLabelValues(l.name, map[bool]string{true: "repaired", false: "intact"}[drifted]).Inc()
			if drifted {
				full, pending, repairing = true, true, true
			}
		case <-resync.C():
			if l.drifted(ctx, "resync period") {
				full, pending, repairing = true, true, true
			}
		}
	}
}

func (l *syncLoop) wrote() {
	if l.written != nil {
		l.written()
	}
}

// drifted runs verify, and logs and counts the drift it finds; trigger says what asked.
func (l *syncLoop) drifted(ctx context.Context, trigger string) bool {
	err := l.feature.verify(ctx)
	if err != nil {
		l.log.Warn(l.repairMsg, "reason", err, "trigger", trigger)
		l.metrics.driftRepairs.Inc()
	}
	return err != nil
}

// syncOnce runs the feature's sync for the changes seen so far.
func (l *syncLoop) syncOnce(ctx context.Context, full bool) error {
	seen := l.lastEvent.Swap(0)
	var since time.Time
	if seen != 0 {
		since = time.Unix(0, seen)
	}
	err := l.feature.sync(ctx, full, since)
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
	start := l.clock.Now()
	res, err := l.compactor.Compact(ctx)
	if err != nil {
		l.metrics.syncErrors.Inc()
		return err
	}
	l.wrote()
	l.metrics.compactions.Inc()
	l.status.update(func(fs *statusapi.FeatureStatus) { fs.CompactionPending = l.compactor.CompactionPending() })
	l.log.Info("compacted: removed what earlier changes left unreachable", "backend", l.backend,
		"operations", res.Operations, "full", res.Full, "took", l.clock.Since(start).Round(time.Microsecond))
	return nil
}

// retire runs a feature's clean-up of other backends' rules; a failure is reported and does not
// stop the agent, whose own rules are in place.
func retire(ctx context.Context, log *slog.Logger, feature string, fn func(context.Context) error) {
	if fn == nil {
		return
	}
	if err := fn(ctx); err != nil {
		log.Warn("could not remove what another backend left in the kernel", "feature", feature, "err", err)
	}
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
