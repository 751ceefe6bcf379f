package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/policy"
)

// metrics are the agent's Prometheus metrics, on a registry of its own so that tests can run
// several agents in one process.
type metrics struct {
	registry *prometheus.Registry
	// policy are the NetworkPolicy loop's metrics, named as before the masquerade feature came.
	policy          featureMetrics
	compactions     prometheus.Counter
	kernelObjects   *prometheus.GaugeVec
	backendInfo     *prometheus.GaugeVec
	localPods       prometheus.Gauge
	selectedPods    prometheus.Gauge
	policiesApplied prometheus.Gauge
	clusterPolicies prometheus.Gauge
	// appliedGeneration is the Generation of the cluster state snapshot each feature's rules
	// in the kernel come from (see Status).
	appliedGeneration *prometheus.GaugeVec
	policiesSkipped   prometheus.Gauge
	// establishedErrors counts failed passes of the flow judge (see flowJudge).
	establishedErrors prometheus.Counter
	// droppedPackets and dropLogLost are registered only with drop logging on.
	droppedPackets *prometheus.CounterVec
	dropLogLost    prometheus.Counter
	// foreignChanges counts other processes' commits to our nf_tables tables (see watch.go).
	foreignChanges *prometheus.CounterVec
	// enforcementRefused is 1 for a reason the NetworkPolicy feature refuses to enforce (see ipvs.go).
	enforcementRefused *prometheus.GaugeVec
}

// Buckets from 1 ms to about 16 s: incremental syncs take milliseconds, a full sync of a large
// node seconds.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		compactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netwarden_compactions_total",
			Help: "Times removals that changes deferred (iptables-nft) were applied once the rules were quiet.",
		}),
		kernelObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netwarden_kernel_objects",
			Help: "Objects netwarden keeps in the kernel, by backend and kind (chains, rules, sets, elements).",
		}, []string{"backend", "kind"}),
		backendInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netwarden_backend_info",
			Help: "The kernel backend in use (value 1).",
		}, []string{"feature", "backend"}),
		localPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netwarden_local_pods",
			Help: "Pods on this node that take part in NetworkPolicy (running or pending, with IPs, not host network).",
		}),
		selectedPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netwarden_local_pods_selected",
			Help: "Local pods selected by at least one NetworkPolicy.",
		}),
		policiesApplied: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netwarden_policies_selecting_local_pods",
			Help: "NetworkPolicies that select at least one local pod.",
		}),
		clusterPolicies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netwarden_cluster_policies_selecting_local_pods",
			Help: "ClusterNetworkPolicies (both tiers) that select at least one local pod.",
		}),
		appliedGeneration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netwarden_applied_generation",
			Help: "Generation of the cluster state snapshot whose rules the kernel holds, by feature (also on /status with the source revision); feature \"established-flows\" is the Generation whose rules established flows were last re-judged by.",
		}, []string{"feature"}),
		establishedErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netwarden_established_pass_errors_total",
			Help: "Passes over the conntrack table to re-judge established flows that failed; they are retried.",
		}),
		policiesSkipped: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netwarden_policies_skipped",
			Help: "NetworkPolicies the backend cannot express, applied fail-closed: their pods stay isolated, their rules admit nothing. The log names each.",
		}),
	}
	m.foreignChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "netwarden_foreign_kernel_changes_total",
		Help: "Commits of other processes to the nf_tables tables a feature keeps (nftables, iptables-nft), from the kernel's notifications, by feature and outcome: repaired (our rules had changed and were restored at once) or intact (they had not). Notifications lost to an overflow count as a change.",
	}, []string{"feature", "outcome"})
	m.enforcementRefused = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "netwarden_enforcement_refused",
		Help: "1 while the NetworkPolicy feature refuses to enforce for the reason given (kube-proxy-ipvs: kube-proxy's IPVS mode delivers Service traffic past the hooks policy is judged in); every sync fails with that reason until it is gone.",
	}, []string{"reason"})
	m.registry.MustRegister(m.foreignChanges, m.enforcementRefused)
	m.policy = newFeatureMetrics(m.registry, "netwarden_", "NetworkPolicy", "a change of cluster state")
	m.registry.MustRegister(m.appliedGeneration, m.establishedErrors, m.compactions, m.kernelObjects,
		m.backendInfo, m.localPods, m.selectedPods, m.policiesApplied, m.clusterPolicies, m.policiesSkipped,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.droppedPackets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "netwarden_dropped_packets_total",
		Help: "Packets of new connections that policy dropped and the kernel logged (--log-drops; within its rate limit), by direction, namespace of the NetworkPolicies (empty for a ClusterNetworkPolicy) and policy.",
	}, []string{"direction", "namespace", "policy"})
	m.dropLogLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "netwarden_drop_log_lost_total",
		Help: "Times the drop log socket overflowed and the kernel discarded logged drops before the agent read them.",
	})
	return m
}

// registerDropLog registers the drop log's metrics: the lost counter always, the dropped
// packets only when drops are logged (the reader may be there for staged verdicts alone).
func (m *metrics) registerDropLog(drops bool) {
	m.registry.MustRegister(m.dropLogLost)
	if drops {
		m.registry.MustRegister(m.droppedPackets)
	}
}

// featureMetrics are the metrics every feature's sync has, under the feature's name prefix.
type featureMetrics struct {
	syncDuration *prometheus.HistogramVec
	latency      prometheus.Histogram
	syncErrors   *prometheus.CounterVec
	driftRepairs prometheus.Counter
}

// newFeatureMetrics registers a feature's sync metrics: prefix+"sync_duration_seconds" and the
// others; rules names the feature's rules and change what changes them, for the help texts.
func newFeatureMetrics(reg *prometheus.Registry, prefix, rules, change string) featureMetrics {
	m := featureMetrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: prefix + "sync_duration_seconds", Buckets: latencyBuckets,
			Help: "Time to compute the desired " + rules + " rules and apply them to the kernel, by backend and by full or partial sync.",
		}, []string{"backend", "sync"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: prefix + "programming_latency_seconds", Buckets: latencyBuckets,
			Help: "Time from " + change + " being seen to the kernel holding the " + rules + " rules for it.",
		}),
		syncErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "sync_errors_total",
			Help: rules + " syncs that failed; the kernel kept the last applied rules.",
		}, []string{"backend"}),
		driftRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "drift_repairs_total",
			Help: "Times the " + rules + " rules were found changed by someone else and restored.",
		}),
	}
	reg.MustRegister(m.syncDuration, m.latency, m.syncErrors, m.driftRepairs)
	return m
}

// observe records a successful sync that began at start, for changes first seen at seen (zero
// when none).
func (m featureMetrics) observe(backend string, full bool, start, seen time.Time) {
	kind := "partial"
	if full {
		kind = "full"
	}
	m.syncDuration.WithLabelValues(backend, kind).Observe(time.Since(start).Seconds())
	if !seen.IsZero() {
		m.latency.Observe(time.Since(seen).Seconds())
	}
}

// loopMetrics are what a sync loop counts itself.
type loopMetrics struct {
	syncErrors, driftRepairs prometheus.Counter
	// compactions counts the applied deferred removals (NetworkPolicy's only, so unlabelled).
	compactions prometheus.Counter
	// foreignChanges counts other processes' commits to the feature's tables, by outcome.
	foreignChanges *prometheus.CounterVec
}

// loopMetrics returns the metrics of the loop of a feature whose sync metrics are fm.
func (m *metrics) loopMetrics(fm featureMetrics, backend string) loopMetrics {
	// The error counter is created here so that it is exported as 0 from the start.
	return loopMetrics{syncErrors: fm.syncErrors.WithLabelValues(backend), driftRepairs: fm.driftRepairs,
		compactions: m.compactions, foreignChanges: m.foreignChanges}
}

func (m *metrics) observeSync(backend string, res dataplane.SyncResult, stats policy.Stats, start, seen time.Time) {
	m.policy.observe(backend, res.Full, start, seen)
	m.kernelObjects.WithLabelValues(backend, "chains").Set(float64(res.Size.Chains))
	m.kernelObjects.WithLabelValues(backend, "rules").Set(float64(res.Size.Rules))
	m.kernelObjects.WithLabelValues(backend, "sets").Set(float64(res.Size.Sets))
	m.kernelObjects.WithLabelValues(backend, "elements").Set(float64(res.Size.Elements))
	m.localPods.Set(float64(stats.LocalPods))
	m.selectedPods.Set(float64(stats.IsolatedPods))
	m.policiesApplied.Set(float64(stats.PoliciesSelecting))
	m.clusterPolicies.Set(float64(stats.ClusterPoliciesSelecting))
	m.policiesSkipped.Set(float64(len(res.Skipped)))
}
