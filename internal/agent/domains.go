package agent

import (
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/domains"
	"github.com/netwarden/netwarden/internal/policy"
)

// DomainNames configures the learning of domainNames peers' addresses.
type DomainNames struct {
	domains.Config
	// Servers, when set, are the only DNS servers whose answers are believed. Otherwise they
	// are the addresses of the pods in ServerNamespace whose labels ServerLabels selects (the
	// pods behind the kube-dns Service), as the cluster state has them.
	Servers         []netip.Addr
	ServerNamespace string
	ServerLabels    labels.Selector
}

// domainLearning is the agent's learner and how it finds the servers.
type domainLearning struct {
	cfg     *DomainNames
	learner *domains.Learner
	log     *slog.Logger
	// failing is the error of the last update, logged once ("" while it works).
	failing string
	// restoredAfterSync: the kernel's DomainSets were read back after the first sync.
	restoredAfterSync bool
	// serversGen is the generation whose pods servers were found from (0: none yet).
	serversGen uint64
	servers    []netip.Addr
}

func newDomainLearning(a *Agent) *domainLearning {
	cfg := a.np.Domains
	dl, ok := a.np.Backend.(policy.DomainLearning)
	if cfg == nil || !ok {
		return nil
	}
	c := cfg.Config
	if c.Log == nil {
		c.Log = a.log.With("feature", "domain names")
	}
	d := &domainLearning{cfg: cfg, learner: domains.New(c, dl), log: c.Log}
	held := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "netwarden_domain_answer_hold_seconds",
		Help:    "How long a DNS reply to a pod was held: from the queue to its release, its addresses written into the kernel.",
		Buckets: domainHeldBuckets,
	})
	a.metrics.registry.MustRegister(held, &domainCollector{d: d, held: held})
	return d
}

// update follows a sync: the DomainSets the kernel now holds, and the servers of st. A failure
// (the queue bound by another process, say) is logged and retried at the next sync, and does
// not fail the sync: the rules are in the kernel, and the domainNames peers, Accept-only, admit
// nothing until answers are learned.
func (d *domainLearning) update(a *Agent, st *cluster.State, rs *policy.Ruleset) {
	if d == nil || rs == nil {
		return
	}
	if !d.restoredAfterSync {
		// A backend whose syncs keep the sets (iptables) reads them back only now that it
		// knows which are the DomainSets'.
		d.restoredAfterSync = true
		d.restore(a)
	}
	var servers []netip.Addr
	if len(rs.DomainSets) > 0 { // otherwise no reply is queued: no need to know the servers
		servers = d.serversOf(st)
	}
	err := d.learner.Update(rs.DomainSets, servers)
	switch {
	case err != nil && err.Error() != d.failing:
		d.failing = err.Error()
		d.log.Error("cannot learn the addresses of domainNames peers; they admit nothing until it can (retried at every sync)", "err", err)
	case err == nil && d.failing != "":
		d.failing = ""
		d.log.Info("learning the addresses of domainNames peers again")
	}
}

// restore starts the learner from what the kernel's DomainSets hold, before the first sync
// replaces them (backends whose full sync keeps them need not).
func (d *domainLearning) restore(a *Agent) {
	if d == nil {
		return
	}
	r, ok := a.np.Backend.(policy.LearnedReader)
	if !ok {
		return
	}
	elems, err := r.ReadLearned()
	if err != nil {
		a.log.Warn("reading the addresses learned before this start: they are learned again from the next answers", "err", err)
		return
	}
	d.learner.Restore(elems)
	if len(elems) > 0 {
		a.log.Info("addresses learned before this start kept", "feature", "domain names", "addresses", len(elems))
	}
}

// verify checks the learner's queue rules (nil without a learner).
func (d *domainLearning) verify() error {
	if d == nil {
		return nil
	}
	return d.learner.Verify()
}

// serversOf returns the believed servers of st: the configured ones, or the addresses of the
// DNS pods, found again only when some pod of their namespace changed since the snapshot they
// were found from (a sync must not walk every pod of the cluster).
func (d *domainLearning) serversOf(st *cluster.State) []netip.Addr {
	if len(d.cfg.Servers) > 0 {
		return d.cfg.Servers
	}
	prefix := d.cfg.ServerNamespace + "/"
	if d.serversGen != 0 && st.Changes != nil && st.Changes.Since == d.serversGen &&
		!slices.ContainsFunc(st.Changes.Pods, func(k string) bool { return strings.HasPrefix(k, prefix) }) {
		d.serversGen = st.Generation
		return d.servers
	}
	d.serversGen, d.servers = st.Generation, d.dnsPods(st)
	return d.servers
}

func (d *domainLearning) dnsPods(st *cluster.State) []netip.Addr {
	var out []netip.Addr
	for _, p := range st.Pods.All() {
		if p.Namespace != d.cfg.ServerNamespace || p.HostNetwork || !d.cfg.ServerLabels.Matches(labels.Set(p.Labels)) {
			continue
		}
		out = append(out, p.IPs...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// domainCollector exports the learner's counts when /metrics is scraped.
type domainCollector struct {
	d    *domainLearning
	held prometheus.Histogram
}

var (
	domainNamesDesc = prometheus.NewDesc("netwarden_domain_names",
		"Domain names whose learned addresses the kernel admits now (names matching a domainNames pattern).", nil, nil)
	domainAddrsDesc = prometheus.NewDesc("netwarden_domain_addresses",
		"Addresses admitted now, counted once per domainNames pattern that admits them.", nil, nil)
	domainAnswersDesc = prometheus.NewDesc("netwarden_domain_answers_total",
		"DNS replies to pods by outcome: believed (from a cluster DNS server, read), admitting (believed and admitting an address), unreadable (queued but no DNS response), refused (UDP from port 53 of no believed server, to anyone but a believed server; never read).",
		[]string{"outcome"}, nil)
)

func (c *domainCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- domainNamesDesc
	ch <- domainAddrsDesc
	ch <- domainAnswersDesc
}

func (c *domainCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.d.learner.Stats()
	for _, h := range st.Held {
		c.held.Observe(h.Seconds())
	}
	ch <- prometheus.MustNewConstMetric(domainNamesDesc, prometheus.GaugeValue, float64(st.Names))
	ch <- prometheus.MustNewConstMetric(domainAddrsDesc, prometheus.GaugeValue, float64(st.Addresses))
	for outcome, n := range map[string]uint64{"believed": st.Believed, "admitting": st.Admitting, "unreadable": st.Unreadable, "refused": st.Refused} {
		ch <- prometheus.MustNewConstMetric(domainAnswersDesc, prometheus.CounterValue, float64(n), outcome)
	}
}

// domainHeldBuckets spans a netlink transaction (tens of microseconds) to a slow one.
var domainHeldBuckets = []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3}
