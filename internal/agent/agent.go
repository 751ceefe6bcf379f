// Package agent runs the node agent's sync loop: cluster state in, one kernel transaction out,
// level-triggered, so the order in which events arrive never matters.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/guard"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// Config configures an Agent.
type Config struct {
	NodeName string
	Source   cluster.Source
	// NetworkPolicy configures NetworkPolicy enforcement; nil disables it.
	NetworkPolicy *NetworkPolicy
	// Masquerade configures SNAT of pod traffic; nil disables it.
	Masquerade *Masquerade
	HealthAddr string
	// Profiling serves Go's profiles (net/http/pprof) under /debug/pprof/ on HealthAddr, to
	// find where the agent's CPU time and memory go on a live node.
	Profiling bool
	Logger    *slog.Logger
}

// NetworkPolicy configures the agent's NetworkPolicy feature.
type NetworkPolicy struct {
	Backend policy.Backend
	// RetireOthers, when set, removes what other NetworkPolicy backends (and guards) left in
	// the kernel (an earlier run on nftables when this one uses iptables, say). It runs after
	// the first successful sync, so that the old rules judge traffic until the new ones do.
	RetireOthers func(context.Context) error
	// ResyncPeriod is how often the kernel is checked for drift and repaired.
	ResyncPeriod time.Duration
	// MinSyncInterval coalesces bursts of events into one transaction: when changes came while
	// a sync ran, the next starts at least this long after it began. A change that finds the
	// agent idle is synced at once.
	MinSyncInterval time.Duration
	// CompactDelay is how long the rules must have been quiet before a backend's deferred
	// removals are applied (see dataplane.Compactor).
	CompactDelay time.Duration
	// DropLog, when set, logs the packets policy drops (see policy.DropLog): the backend
	// adds the log rules and the agent reads the group, one line per denied attempt.
	DropLog *policy.DropLog
	// StagedLog, when set, logs each new connection that the staged policies would judge
	// otherwise (backends that implement policy.StagedReporter), with the same limits and to
	// the same group as DropLog when both are set. Such connections are counted either way.
	StagedLog *policy.DropLog
	// Counters, when set, counts the packets each policy's rules decide and exports them as
	// netwarden_policy_packets_total (backends that implement policy.PolicyCounters).
	Counters bool

	// Domains, when set, learns the addresses of domainNames peers (backends that implement
	// policy.DomainLearning): see domains.go.
	Domains *DomainNames

	// Guard, DenyMark and GateSocket: see guarded.go.
	Guard      guard.Guard
	DenyMark   uint32
	GateSocket string
}

// Agent keeps the kernel in step with the cluster.
type Agent struct {
	cfg         Config
	np          *NetworkPolicy // cfg.NetworkPolicy
	log         *slog.Logger
	compiler    *policy.Compiler
	metrics     *metrics
	ready       atomic.Bool // the NetworkPolicy feature (or its absence) is ready
	readyLogged atomic.Bool
	// changed is signalled (without blocking) on every notification of the source, so that
	// waiting for its initial sync ends when it ends rather than at the next poll; after it,
	// releaseWhenQuiet reads it.
	changed chan struct{}
	policy  *syncLoop // nil without NetworkPolicy
	masq    *masqLoop
	status  statusBoard
	// inSync: the kernel holds the Ruleset the compiler made last (policy loop only).
	inSync  bool
	skipped skipReport
	drops   *dropLog // nil without DropLog, and until Run opens it
	// applied is the Ruleset the kernel holds, for what reads the kernel's counters and logs.
	applied atomic.Pointer[policy.Ruleset]
	// legacy polls the iptables-legacy tables the features keep (see watch.go); nil without.
	legacy atomic.Pointer[legacyPoller]
	// ipvs follows kube-proxy's IPVS interface (see ipvs.go).
	ipvs ipvsWatch
	guarded
	// domains learns domainNames peers' addresses; nil without.
	domains *domainLearning
}

// New returns an Agent; call Run or Once.
func New(cfg Config) *Agent {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, compiler: policy.NewCompiler(cfg.NodeName), metrics: newMetrics(), changed: make(chan struct{}, 1)}
	if np := cfg.NetworkPolicy; np != nil {
		cp := *np
		if cp.ResyncPeriod <= 0 {
			cp.ResyncPeriod = 30 * time.Second
		}
		if cp.CompactDelay <= 0 {
			cp.CompactDelay = time.Second
		}
		if cp.MinSyncInterval <= 0 {
			cp.MinSyncInterval = 10 * time.Millisecond
		}
		a.np = &cp
	}
	a.flows = newFlowJudge(a)
	if a.np != nil {
		a.status.policy = &statusapi.FeatureStatus{Backend: a.np.Backend.Name()}
		a.policy = a.newPolicyLoop()
		if dl, ok := a.np.Backend.(policy.DropLogger); ok && a.np.DropLog != nil {
			dl.SetDropLog(a.np.DropLog)
		}
		if sr, ok := a.np.Backend.(policy.StagedReporter); ok {
			sr.SetStagedLog(a.np.StagedLog)
			a.metrics.registry.MustRegister(newStagedCounterCollector(a, sr))
		}
		if pc, ok := a.np.Backend.(policy.PolicyCounters); ok && a.np.Counters {
			pc.SetPolicyCounters(true)
			a.metrics.registry.MustRegister(newPolicyCounterCollector(a, pc))
		}
		if a.np.GateSocket != "" {
			a.gate = newGateState()
		}
		a.domains = newDomainLearning(a)
	}
	if cfg.Masquerade != nil {
		a.masq = newMasqLoop(a, cfg.Masquerade)
	}
	return a
}

func (a *Agent) notify() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
	if a.policy != nil {
		a.policy.notify()
	}
	if a.masq != nil {
		a.masq.loop.notify()
	}
}

// featureReady marks a feature ready (its flag, read by Ready), which changes the status, and
// logs "ready" once, when the last enabled feature has completed its first sync.
func (a *Agent) featureReady(flag *atomic.Bool) {
	flag.Store(true)
	a.status.touch()
	if a.Ready() && !a.readyLogged.Swap(true) {
		a.log.Info("ready")
		// The initial load and full sync make most of the garbage the agent ever makes (at
		// 16,000 objects the heap peaks near twice what it keeps); give those pages back now
		// rather than hold them as the resident size of a node agent that then sits mostly idle.
		settleGC()
		go debug.FreeOSMemory()
	}
}

// featureEntry is one feature's entry on the status board, where its sync loop reports.
type featureEntry struct {
	a     *Agent
	entry **statusapi.FeatureStatus
	ready *atomic.Bool
}

func (e featureEntry) update(fn func(*statusapi.FeatureStatus)) { e.a.status.update(e.entry, fn) }

func (e featureEntry) becameReady() { e.a.featureReady(e.ready) }

// Ready reports whether the first sync of every enabled feature succeeded.
func (a *Agent) Ready() bool { return a.ready.Load() && (a.masq == nil || a.masq.ready.Load()) }

func (a *Agent) startSource(ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- a.cfg.Source.Run(ctx, a.notify) }()
	return errc
}

func (a *Agent) waitSynced(ctx context.Context, srcErr <-chan error) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !a.cfg.Source.HasSynced() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-srcErr:
			if err == nil {
				err = errors.New("source stopped before its initial sync")
			}
			return fmt.Errorf("cluster state source: %w", err)
		case <-a.changed:
		case <-t.C:
		}
	}
	return nil
}

// policyApplied records that the kernel holds the NetworkPolicy rules of st, and which policies
// the backend skipped in them (res, nil when they did not change). One update of the status,
// so that a reader waiting for the change is woken once, by the change it waits for.
func (a *Agent) policyApplied(st *cluster.State, res *dataplane.SyncResult) {
	pending := false
	if c, ok := a.np.Backend.(dataplane.Compactor); ok {
		pending = c.CompactionPending()
	}
	a.status.update(&a.status.policy, func(fs *statusapi.FeatureStatus) {
		fs.Generation, fs.Revision, fs.AppliedAt, fs.LastError = st.Generation, st.Revision, time.Now(), ""
		fs.CompactionPending = pending
		if res != nil {
			fs.Skipped = res.Skipped
		}
	})
	a.metrics.appliedGeneration.WithLabelValues("network-policy").Set(float64(st.Generation))
}

// Once waits for the source and replaces the kernel state once.
func (a *Agent) Once(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcErr := a.startSource(ctx)
	if err := a.waitSynced(ctx, srcErr); err != nil {
		return err
	}
	// The two features program separate tables and share nothing but the snapshot: masquerade
	// (a few rules, but several tool runs to check and retire) goes beside the NetworkPolicy
	// compile and transaction, and one feature's failure does not keep the other's rules out.
	var masqErr error
	var wg sync.WaitGroup
	if a.masq != nil {
		wg.Go(func() { masqErr = a.masq.once(ctx) })
	}
	policyErr := a.policyOnce(ctx)
	wg.Wait()
	return errors.Join(policyErr, masqErr)
}

// policyOnce programs the NetworkPolicy rules of the current snapshot in one full transaction.
// It does not read the table back: the transaction is atomic, so its success is the proof that
// the kernel holds the rules, and reading 27,000 objects back would cost a cold start half a
// second at the benchmark's scale. The long-running agent's resync-verify reads back.
func (a *Agent) policyOnce(ctx context.Context) error {
	if a.np == nil {
		return nil
	}
	st := a.cfg.Source.Snapshot()
	a.domains.restore(a)
	start := time.Now()
	rs, stats := a.compiler.Compile(st)
	compiled := time.Now()
	res, err := a.np.Backend.FullSync(ctx, rs)
	if err != nil {
		return err
	}
	a.skipped.report(a.log, a.np.Backend.Name(), res.Skipped)
	a.log.Info("synced", "backend", a.np.Backend.Name(), "generation", st.Generation, "full", res.Full, "operations", res.Operations,
		"compile", compiled.Sub(start).Round(time.Microsecond), "apply", time.Since(compiled).Round(time.Microsecond),
		"localPods", stats.LocalPods, "isolatedPods", stats.IsolatedPods, "policies", stats.PoliciesSelecting,
		"clusterPolicies", stats.ClusterPoliciesSelecting, "staged", stats.Staged)
	a.applied.Store(rs)
	a.policyApplied(st, &res)
	retire(ctx, a.log, a.policy.name, a.np.RetireOthers)
	return nil
}

// Run syncs until ctx is cancelled. On return the kernel keeps the last applied rules, so an
// agent restart or upgrade neither opens nor breaks traffic.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if a.cfg.HealthAddr != "" {
		if err := a.serveHealth(ctx); err != nil {
			return err
		}
	}
	if a.gate != nil {
		if err := a.serveGate(ctx); err != nil {
			return err
		}
	}
	if a.np != nil {
		a.metrics.backendInfo.WithLabelValues("network-policy", a.np.Backend.Name()).Set(1)
		a.ipvs.watch(ctx, a.log)
	}
	if p, ok := a.guard().(guard.Prober); ok {
		// The guard syncs after the first sync of the rules; what it checks before its first
		// use, it checks now, beside the load of the cluster state. A failure is its first
		// Sync's to report.
		go func() { _ = p.Probe() }()
	}
	if cfg, what := a.nflogConfig(); cfg != nil {
		// Before the first sync, so that no logged packet goes unread and a group another
		// process holds stops the agent with a clear error.
		d, err := openDropLog(a, cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		a.drops = d
		go d.run(ctx)
		a.log.Info("reading logged packets", "for", what, "nflogGroup", cfg.Group, "rate", cfg.Rate, "burst", cfg.Burst)
	}
	if a.domains != nil {
		a.domains.restore(a)
		go a.domains.learner.Run(ctx)
	}
	srcErr := a.startSource(ctx)
	if err := a.waitSynced(ctx, srcErr); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	a.log.Info("cluster state synced", "node", a.cfg.NodeName)
	go a.releaseWhenQuiet(ctx)
	go a.watchKernel(ctx)

	// Each feature runs its own loop on the shared state, so that one failing (an invalid
	// masquerade config, say) never holds the other back.
	loops := make(chan error, 2)
	if a.masq != nil {
		go func() { loops <- a.masq.run(ctx) }()
	}
	if a.np == nil {
		a.featureReady(&a.ready)
	} else {
		go a.flows.run(ctx)
		go func() { loops <- a.policy.run(ctx, nil) }()
	}
	select {
	case <-ctx.Done():
		a.log.Info("stopping; rules stay in place")
		return nil
	case err := <-loops:
		return err
	case err := <-srcErr:
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("cluster state source: %w", err)
	}
}

// newPolicyLoop returns the loop that keeps the NetworkPolicy rules in step with the state.
func (a *Agent) newPolicyLoop() *syncLoop {
	compactor, _ := a.np.Backend.(dataplane.Compactor)
	return newSyncLoop(&syncLoop{
		feature: policyFeature{a}, status: featureEntry{a, &a.status.policy, &a.ready}, log: a.log,
		name: "network policy", backend: a.np.Backend.Name(), metrics: a.metrics.loopMetrics(a.metrics.policy, a.np.Backend.Name()),
		retireOthers: a.np.RetireOthers, written: a.kernelWritten,
		minInterval: a.np.MinSyncInterval, compactor: compactor, compactDelay: a.np.CompactDelay,
		failedMsg: "sync failed; the kernel keeps the last applied rules", repairMsg: "repairing kernel state",
	})
}

// policyFeature is the NetworkPolicy feature as its sync loop sees it.
type policyFeature struct{ a *Agent }

func (f policyFeature) sync(ctx context.Context, full bool, seen time.Time) error {
	return f.a.syncOnce(ctx, full, seen)
}

func (f policyFeature) verify(ctx context.Context) error { return f.a.verifyPolicy(ctx) }

func (f policyFeature) resyncEvery() time.Duration { return f.a.np.ResyncPeriod }

// guard is the NetworkPolicy feature's guard, nil without one.
func (a *Agent) guard() guard.Guard {
	if a.np == nil {
		return nil
	}
	return a.np.Guard
}

// verifyPolicy is the NetworkPolicy loop's verify: the backend's rules, and the guard's,
// which its syncs install.
func (a *Agent) verifyPolicy(ctx context.Context) error {
	err := a.np.Backend.Verify(ctx)
	if a.np.Guard == nil {
		return errors.Join(err, a.domains.verify())
	}
	// After the rules beside it drifted, the repair rewrites the guard whole without the cost
	// of checking it first: a repair's latency is an open window.
	if err == nil {
		err = a.np.Guard.Verify(ctx)
	}
	if err != nil {
		a.np.Guard.Invalidate()
	}
	return errors.Join(err, a.domains.verify())
}

// syncOnce is the NetworkPolicy loop's sync.
func (a *Agent) syncOnce(ctx context.Context, full bool, seen time.Time) error {
	start := time.Now()
	if err := a.checkIPVS(); err != nil {
		a.inSync = false
		return err
	}
	// The snapshot's Generation and Revision are what the kernel holds once its rules apply.
	st := a.cfg.Source.Snapshot()
	cst := a.compileState(st)
	if !full && a.inSync && a.compiler.Unchanged(cst) {
		// A snapshot that moved only the source's Revision needs no compile and no kernel
		// transaction: the rules in the kernel stand for it as they are.
		a.unchangedSync()
		a.domains.update(a, cst, a.applied.Load())
		a.policyApplied(st, nil)
		a.flows.submit(a.applied.Load(), st.Generation, false, false)
		a.log.Debug("no change", "backend", a.np.Backend.Name(), "generation", st.Generation, "objectsChanged", false)
		return nil
	}
	a.inSync = false
	rs, stats := a.compiler.Compile(cst)
	compiled := time.Now()
	var res dataplane.SyncResult
	var err error
	if full {
		res, err = a.np.Backend.FullSync(ctx, rs)
	} else {
		res, err = a.np.Backend.Sync(ctx, rs)
	}
	if err != nil {
		return err
	}
	applied := time.Now()
	if err := a.afterSync(ctx, cst, rs); err != nil {
		return err
	}
	a.domains.update(a, cst, rs)
	a.inSync = true
	prev := a.applied.Swap(rs)
	a.metrics.observeSync(a.np.Backend.Name(), res, stats, start, seen)
	a.skipped.report(a.log, a.np.Backend.Name(), res.Skipped)
	attrs := []any{"backend", a.np.Backend.Name(), "generation", st.Generation, "full", res.Full, "operations", res.Operations,
		"compile", compiled.Sub(start).Round(time.Microsecond), "apply", applied.Sub(compiled).Round(time.Microsecond),
		"guard", time.Since(applied).Round(time.Microsecond),
		"localPods", stats.LocalPods, "isolatedPods", stats.IsolatedPods, "policies", stats.PoliciesSelecting,
		"clusterPolicies", stats.ClusterPoliciesSelecting, "staged", stats.Staged}
	attrs = syncedAttrs(attrs, seen, res)
	if res.Operations > 0 || res.Full {
		a.log.Info("synced", attrs...)
	} else {
		a.log.Debug("no change", attrs...)
	}
	// Before the status says so: whoever reads it may change the tables next, and that change
	// must not be taken for ours.
	a.kernelWritten()
	// After the log line, so that whoever sees the status can read the line too.
	a.policyApplied(st, &res)
	a.flows.submit(rs, st.Generation, res.Operations > 0 || res.Full, a.narrowed(prev, rs, res))
	return nil
}

// serveHealth serves /healthz, /readyz, /status and /metrics on HealthAddr: HOST:PORT, or
// unix:PATH for a socket that a process in another network namespace (a test outside the
// node's) can reach.
func (a *Agent) serveHealth(ctx context.Context) error {
	network, addr := "tcp", a.cfg.HealthAddr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
		// A socket file left by an earlier run would make Listen fail.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--health-addr %s: %w", a.cfg.HealthAddr, err)
		}
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return fmt.Errorf("--health-addr %s: %w", a.cfg.HealthAddr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", a.serveStatus)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.registry, promhttp.HandlerOpts{}))
	if a.cfg.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Ready() {
			http.Error(w, "not ready: first sync has not completed", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Requests see the agent's context: a long poll of /status ends when the agent stops.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	return nil
}
