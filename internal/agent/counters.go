package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/netwarden/netwarden/internal/policy"
)

// ruleCounterCollector exports counters the kernel keeps per rule as one Prometheus counter
// vector, read when scraped. The kernel's counters start again at zero whenever a sync
// rewrites their rule; the collector adds up what each rule counted since it last looked, so
// the exported counters only grow. C is what the backend reports of one rule.
type ruleCounterCollector[C any] struct {
	a    *Agent
	desc *prometheus.Desc
	what string // for the warning when reading fails
	// read returns the counted rules, or nothing to read (rs has no such rule).
	read func(ctx context.Context, rs *policy.Ruleset) ([]C, error)
	// rule identifies a counted rule and returns its count.
	rule func(C) (string, uint64)
	// labels returns the label values each of the rule's packets counts for, none for a rule
	// of something rs no longer has.
	labels func(rs *policy.Ruleset, c C) [][]string

	mu     sync.Mutex
	last   map[string]uint64 // by rule
	totals map[string]*labelledCount
}

type labelledCount struct {
	labels []string
	v      float64
}

func newRuleCounterCollector[C any](a *Agent, desc *prometheus.Desc, what string) *ruleCounterCollector[C] {
	return &ruleCounterCollector[C]{a: a, desc: desc, what: what, last: map[string]uint64{}, totals: map[string]*labelledCount{}}
}

func (c *ruleCounterCollector[C]) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *ruleCounterCollector[C]) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.a.applied.Load(); rs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		counters, err := c.read(ctx, rs)
		cancel()
		if err != nil {
			c.a.log.Warn("reading "+c.what, "err", err)
		} else {
			c.add(rs, counters)
		}
	}
	for _, t := range c.totals {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, t.v, t.labels...)
	}
}

func (c *ruleCounterCollector[C]) add(rs *policy.Ruleset, counters []C) {
	seen := make(map[string]uint64, len(counters))
	for _, rc := range counters {
		rule, packets := c.rule(rc)
		seen[rule] = packets
		delta := packets
		if prev, ok := c.last[rule]; ok && packets >= prev {
			delta = packets - prev
		}
		if delta == 0 {
			continue
		}
		for _, labels := range c.labels(rs, rc) {
			key := strings.Join(labels, "\x00")
			t := c.totals[key]
			if t == nil {
				t = &labelledCount{labels: labels}
				c.totals[key] = t
			}
			t.v += float64(delta)
		}
	}
	c.last = seen
}

// newPolicyCounterCollector exports the per-rule counters as netwarden_policy_packets_total,
// summed by policy.
func newPolicyCounterCollector(a *Agent, pc policy.PolicyCounters) *ruleCounterCollector[policy.RuleCounter] {
	c := newRuleCounterCollector[policy.RuleCounter](a, prometheus.NewDesc("netwarden_policy_packets_total",
		"Packets the rules of each policy decided (the first of each connection; later ones are accepted as established before any policy), by kind (NetworkPolicy or ClusterNetworkPolicy), namespace, policy, direction and verdict. A drop for want of an admitting NetworkPolicy rule names every policy isolating the pod. --policy-counters.",
		[]string{"kind", "namespace", "policy", "direction", "verdict"}, nil), "policy counters")
	c.read = func(ctx context.Context, _ *policy.Ruleset) ([]policy.RuleCounter, error) {
		return pc.ReadCounters(ctx)
	}
	c.rule = func(r policy.RuleCounter) (string, uint64) { return r.Rule, r.Packets }
	c.labels = func(rs *policy.Ruleset, r policy.RuleCounter) [][]string {
		if l, ok := counterLabels(rs, r); ok {
			return [][]string{l}
		}
		return nil
	}
	return c
}

func counterLabels(rs *policy.Ruleset, r policy.RuleCounter) ([]string, bool) {
	if p := rs.Policies[r.Source]; p != nil {
		ns, name, _ := strings.Cut(p.Source, "/")
		return []string{"NetworkPolicy", ns, name, string(p.Direction), r.Verdict}, true
	}
	if cp := rs.ClusterPolicies[r.Source]; cp != nil {
		return []string{"ClusterNetworkPolicy", "", cp.Source, string(cp.Direction), r.Verdict}, true
	}
	if g, ok := rs.Groups[r.Source]; ok {
		reason := policy.DropReasons(&policy.Ruleset{Groups: map[string]policy.Group{r.Source: g}, Policies: rs.Policies})[policy.GroupDropID(r.Source)]
		return []string{"NetworkPolicy", reason.Namespace(), reason.PolicyLabel(), string(g.Direction), r.Verdict}, true
	}
	return nil, false
}

// newStagedCounterCollector exports the kernel's counts of the connections staged policies
// would judge otherwise as netwarden_staged_verdicts_total. A difference due to several
// staged policies (a pod they isolate together) counts for each.
func newStagedCounterCollector(a *Agent, sr policy.StagedReporter) *ruleCounterCollector[policy.StagedCounter] {
	c := newRuleCounterCollector[policy.StagedCounter](a, prometheus.NewDesc("netwarden_staged_verdicts_total",
		"New connections that the staged policies (annotated netwarden.io/staged) would judge otherwise than the enforced rules do, by staged policy (namespace/name for a NetworkPolicy, the name of a ClusterNetworkPolicy) and outcome: would-deny (allowed now) or would-allow (denied now).",
		[]string{"policy", "outcome"}, nil), "staged verdict counters")
	c.read = func(ctx context.Context, rs *policy.Ruleset) ([]policy.StagedCounter, error) {
		// Without staged policies the kernel has no such counter; the last read's are gone
		// with their rules.
		if rs.Staged == nil && len(c.last) == 0 {
			return nil, nil
		}
		return sr.ReadStagedCounters(ctx)
	}
	c.rule = func(sc policy.StagedCounter) (string, uint64) { return sc.Rule, sc.Packets }
	c.labels = func(rs *policy.Ruleset, sc policy.StagedCounter) [][]string {
		if rs.Staged == nil {
			return nil
		}
		var out [][]string
		for _, p := range rs.Staged.Causes[sc.Cause].Policies {
			out = append(out, []string{p, sc.Outcome})
		}
		return out
	}
	return c
}
