package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/netwarden/netwarden/internal/policy"
)

// policyCounterCollector exports the kernel's per-rule counters as
// netwarden_policy_packets_total, summed by policy, read when scraped. The kernel's counters
// start again at zero whenever a sync rewrites their rule; the collector adds up what each
// rule counted since it last looked, so the exported counters only grow.
type policyCounterCollector struct {
	a    *Agent
	pc   policy.PolicyCounters
	desc *prometheus.Desc

	mu     sync.Mutex
	last   map[string]uint64     // by RuleCounter.Rule
	totals map[[5]string]float64 // by label values
}

func newPolicyCounterCollector(a *Agent, pc policy.PolicyCounters) *policyCounterCollector {
	return &policyCounterCollector{a: a, pc: pc, last: map[string]uint64{}, totals: map[[5]string]float64{},
		desc: prometheus.NewDesc("netwarden_policy_packets_total",
			"Packets the rules of each policy decided (the first of each connection; later ones are accepted as established before any policy), by kind (NetworkPolicy or ClusterNetworkPolicy), namespace, policy, direction and verdict. A drop for want of an admitting NetworkPolicy rule names every policy isolating the pod. --policy-counters.",
			[]string{"kind", "namespace", "policy", "direction", "verdict"}, nil)}
}

func (c *policyCounterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *policyCounterCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rs := c.a.applied.Load()
	if rs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rules, err := c.pc.ReadCounters(ctx)
		cancel()
		if err != nil {
			c.a.log.Warn("reading policy counters", "err", err)
		} else {
			c.add(rs, rules)
		}
	}
	for labels, v := range c.totals {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, v, labels[:]...)
	}
}

func (c *policyCounterCollector) add(rs *policy.Ruleset, rules []policy.RuleCounter) {
	seen := make(map[string]uint64, len(rules))
	for _, r := range rules {
		seen[r.Rule] = r.Packets
		prev, ok := c.last[r.Rule]
		delta := r.Packets
		if ok && r.Packets >= prev {
			delta = r.Packets - prev
		}
		if delta == 0 {
			continue
		}
		labels, ok := counterLabels(rs, r)
		if !ok {
			continue // a rule of something the Ruleset no longer has
		}
		c.totals[labels] += float64(delta)
	}
	c.last = seen
}

func counterLabels(rs *policy.Ruleset, r policy.RuleCounter) ([5]string, bool) {
	if p := rs.Policies[r.Source]; p != nil {
		ns, name, _ := strings.Cut(p.Source, "/")
		return [5]string{"NetworkPolicy", ns, name, string(p.Direction), r.Verdict}, true
	}
	if cp := rs.ClusterPolicies[r.Source]; cp != nil {
		return [5]string{"ClusterNetworkPolicy", "", cp.Source, string(cp.Direction), r.Verdict}, true
	}
	if g, ok := rs.Groups[r.Source]; ok {
		reason := policy.DropReasons(&policy.Ruleset{Groups: map[string]policy.Group{r.Source: g}, Policies: rs.Policies})[policy.GroupDropID(r.Source)]
		return [5]string{"NetworkPolicy", reason.Namespace(), reason.PolicyLabel(), string(g.Direction), r.Verdict}, true
	}
	return [5]string{}, false
}
