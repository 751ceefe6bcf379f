package agent

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/masquerade"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// Masquerade configures the agent's masquerade feature.
type Masquerade struct {
	Backend masquerade.Backend
	// Config is the watched --masq-config file (or the defaults).
	Config  *masquerade.ConfigFile
	Options masquerade.Options
	// RetireOthers, when set, removes the masquerade rules of other backends after the first
	// successful sync (see Config.RetireOtherPolicyBackends).
	RetireOthers func(context.Context) error
}

// masqLoop keeps the masquerade rules in step with the Nodes and the config file. It is
// event-driven: rules are written only when the desired state changes, and the kernel is
// checked (not rewritten) at the config's resyncInterval.
type masqLoop struct {
	a     *Agent
	cfg   *Masquerade
	loop  *syncLoop
	ready atomic.Bool
	// last is the desired state of the last successful sync; nil before the first one.
	last *masquerade.Desired
	// generation numbers the successful masquerade syncs, for Status: the Revision alone does
	// not change when only the config file does. Only the loop's goroutine touches it.
	generation uint64
	// warnedNoSources avoids repeating the same warning on every Node event.
	warnedNoSources bool
	metrics         *masqMetrics
	// memo is the last desired state computed, with what it was computed from: the loop runs
	// on every event of the source, mostly pod events, and at 5,000 Nodes a computation costs
	// milliseconds. The source hands out the same Nodes map until a Node changes.
	memo struct {
		nodes unsafe.Pointer // the map's identity
		sum   string         // the config content's
		d     *masquerade.Desired
	}
}

type masqMetrics struct {
	featureMetrics
	configErrors prometheus.Counter
	configValid  prometheus.Gauge
	ranges       *prometheus.GaugeVec
}

func newMasqLoop(a *Agent, cfg *Masquerade) *masqLoop {
	m := &masqMetrics{
		featureMetrics: newFeatureMetrics(a.metrics.registry, "netwarden_masquerade_", "masquerade", "a Node or config change"),
		configErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netwarden_masquerade_config_errors_total",
			Help: "Loads of the masquerade config file that failed; the last good config stayed in effect.",
		}),
		configValid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netwarden_masquerade_config_valid",
			Help: "1 when the masquerade config file as it is now is in effect, 0 when it is invalid.",
		}),
		ranges: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netwarden_masquerade_ranges",
			Help: "Address ranges in the masquerade sets, by set (sources, non-masquerade destinations) and family.",
		}, []string{"set", "family"}),
	}
	a.metrics.registry.MustRegister(m.configErrors, m.configValid, m.ranges)
	a.metrics.backendInfo.WithLabelValues("masquerade", cfg.Backend.Name()).Set(1)
	a.status.masq = &statusapi.FeatureStatus{Backend: cfg.Backend.Name()}
	l := &masqLoop{a: a, cfg: cfg, metrics: m}
	l.loop = newSyncLoop(&syncLoop{
		feature: l, status: featureEntry{a, &a.status.masq, &l.ready}, log: a.log,
		name: "masquerade", backend: cfg.Backend.Name(), metrics: a.metrics.loopMetrics(m.featureMetrics, cfg.Backend.Name()),
		retireOthers: cfg.RetireOthers, written: a.kernelWritten,
		// minInterval stays 0, no coalescing delay: computing from the Nodes is cheap, and a
		// sync whose outcome equals the last one sends nothing.
		failedMsg: "masquerade sync failed; the kernel keeps the last applied rules", repairMsg: "restoring masquerade rules",
	})
	return l
}

// masqInputs are what one masquerade sync computed its rules from.
type masqInputs struct {
	config   masquerade.ConfigState
	revision cluster.Revision
}

// desired computes the masquerade state from the config in effect and the current Nodes.
func (l *masqLoop) desired() (*masquerade.Desired, masqInputs, error) {
	cs := l.cfg.Config.State()
	if cs.Err != nil {
		l.metrics.configValid.Set(0)
	} else {
		l.metrics.configValid.Set(1)
	}
	in := masqInputs{config: cs}
	if !cs.Good {
		return nil, in, fmt.Errorf("no valid masquerade config yet: %w", cs.Err)
	}
	var nodes map[string]*corev1.Node
	if nl, ok := l.a.cfg.Source.(cluster.NodeLister); ok {
		nodes, in.revision = nl.Nodes()
	} else {
		st := l.a.cfg.Source.Snapshot()
		nodes, in.revision = st.Nodes, st.Revision
	}
	if !l.cfg.Options.AllSources && len(masquerade.LocalPodCIDRs(nodes, l.a.cfg.NodeName)) == 0 {
		if !l.warnedNoSources {
			l.a.log.Warn("this node has no podCIDRs (no Node object, or spec.podCIDRs empty): nothing is masqueraded until it has; use --masquerade-all-sources for pod networks that do not use them",
				"node", l.a.cfg.NodeName)
			l.warnedNoSources = true
		}
	} else {
		l.warnedNoSources = false
	}
	if id := reflect.ValueOf(nodes).UnsafePointer(); l.memo.d == nil || l.memo.nodes != id || l.memo.sum != cs.Sum {
		l.memo.nodes, l.memo.sum = id, cs.Sum
		l.memo.d = masquerade.Compute(cs.Config, l.cfg.Options, nodes, l.a.cfg.NodeName)
	}
	return l.memo.d, in, nil
}

// applied records that the kernel holds the masquerade rules computed from in (or, with err,
// that it could not be brought there).
func (l *masqLoop) applied(in masqInputs, err error) {
	if err == nil {
		l.generation++
	}
	gen := l.generation
	l.a.status.update(&l.a.status.masq, func(fs *statusapi.FeatureStatus) {
		fs.ConfigRead, fs.ConfigError = in.config.ReadSum, ""
		if in.config.Err != nil {
			fs.ConfigError = in.config.Err.Error()
		}
		if err != nil {
			fs.LastError = err.Error()
			return
		}
		fs.Generation, fs.Revision, fs.Config, fs.AppliedAt, fs.LastError = gen, in.revision, in.config.Sum, time.Now(), ""
	})
	if err == nil {
		l.a.metrics.appliedGeneration.WithLabelValues("masquerade").Set(float64(gen))
	}
}

func (l *masqLoop) once(ctx context.Context) error {
	if _, err := l.cfg.Config.Reload(); err != nil {
		return err
	}
	d, in, err := l.desired()
	if err != nil {
		return err
	}
	res, err := l.cfg.Backend.FullSync(ctx, d)
	if err != nil {
		return err
	}
	l.a.log.Info("masquerade synced", "backend", l.cfg.Backend.Name(), "generation", l.generation+1, "full", true, "operations", res.Operations)
	// An nftables table is replaced in one atomic transaction, whose success is the proof
	// (as for the NetworkPolicy rules of --once, see policyOnce); its read-back would only
	// slow the NetworkPolicy transaction beside it. iptables takes several steps, between
	// which someone else may change the rules: those are read back.
	if _, atomic := l.cfg.Backend.(dataplane.AtomicFullSync); !atomic {
		if err := l.cfg.Backend.Verify(ctx); err != nil {
			return fmt.Errorf("kernel does not hold the desired masquerade state after sync: %w", err)
		}
	}
	l.applied(in, nil)
	retire(ctx, l.a.log, l.loop.name, l.cfg.RetireOthers)
	return nil
}

// run syncs until ctx is done; a failure to watch the config file ends it.
func (l *masqLoop) run(ctx context.Context) error {
	if _, err := l.cfg.Config.Reload(); err != nil {
		l.metrics.configErrors.Inc()
		l.a.log.Error("invalid masquerade config; masquerade rules in the kernel are left as they are until it is fixed", "err", err)
	}
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- l.cfg.Config.Watch(ctx, func() {
			if cs := l.cfg.Config.State(); cs.Err != nil {
				l.metrics.configErrors.Inc()
			}
			l.loop.notify()
		})
	}()
	return l.loop.run(ctx, watchErr)
}

// resyncEvery follows the config in effect.
func (l *masqLoop) resyncEvery() time.Duration {
	if cs := l.cfg.Config.State(); cs.Good {
		return cs.Config.ResyncInterval
	}
	return time.Minute
}

// verify checks nothing before the first sync: no rules of this run exist to drift, and a
// config that never was valid must not count as drift.
func (l *masqLoop) verify(ctx context.Context) error {
	if l.last == nil {
		return nil
	}
	return l.cfg.Backend.Verify(ctx)
}

// sync is the masquerade loop's sync.
func (l *masqLoop) sync(ctx context.Context, full bool, seen time.Time) error {
	start := time.Now()
	d, in, err := l.desired()
	if err != nil {
		l.a.log.Error("masquerade not applied", "err", err)
		l.applied(in, err)
		return errIdle // until the config file is fixed; the watcher will tell us
	}
	if !full && l.last != nil && l.last.Equal(d) {
		l.applied(in, nil)
		return nil
	}
	var res dataplane.SyncResult
	if full {
		res, err = l.cfg.Backend.FullSync(ctx, d)
	} else {
		res, err = l.cfg.Backend.Sync(ctx, d)
	}
	if err != nil {
		l.applied(in, err)
		return err
	}
	l.last = d
	l.metrics.observe(l.cfg.Backend.Name(), res.Full, start, seen)
	for fam, name := range []string{"ipv4", "ipv6"} {
		l.metrics.ranges.WithLabelValues("sources", name).Set(float64(len(d.Sources[fam])))
		l.metrics.ranges.WithLabelValues("non-masquerade", name).Set(float64(len(d.NoMasquerade[fam])))
	}
	attrs := []any{"backend", l.cfg.Backend.Name(), "generation", l.generation + 1, "full", res.Full, "operations", res.Operations,
		"apply", time.Since(start).Round(time.Microsecond),
		"sources", describeRanges(d.Sources), "nonMasqueradeRanges", len(d.NoMasquerade[0]) + len(d.NoMasquerade[1])}
	l.a.log.Info("masquerade synced", syncedAttrs(attrs, seen, res)...)
	// Before the status says so: whoever reads it may change the tables next, and that change
	// must not be taken for ours.
	l.a.kernelWritten()
	// After the log line, so that whoever sees the status can read the line too.
	l.applied(in, nil)
	return nil
}

func describeRanges(rs [2][]masquerade.Range) string {
	var parts []string
	for _, fam := range rs {
		for _, r := range fam {
			parts = append(parts, r.String())
		}
	}
	if len(parts) > 4 {
		return fmt.Sprintf("%s and %d more", strings.Join(parts[:4], ","), len(parts)-4)
	}
	return strings.Join(parts, ",")
}
