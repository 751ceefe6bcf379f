package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// clusterPolicySpec is the benchmark cluster with 1,000 ClusterNetworkPolicies, the scale the
// ClusterNetworkPolicy issue sets.
func clusterPolicySpec() synth.Spec {
	s := synth.Default()
	s.ClusterPolicies = 1000
	return s
}

// clusterPolicyChanges are single ClusterNetworkPolicy events on the loaded node: a new admin
// policy selecting local pods, a priority change that reorders a tier, and a delete.
var clusterPolicyChanges = []change{
	{"cnp-added", func(t *cluster.Tracker, _ *cluster.State, i int) {
		cnp := synth.ClusterPolicy(4) // an admin policy selecting the app-0 pods of team-2
		cnp.Name = fmt.Sprintf("added-%d", i)
		cnp.Spec.Priority = int32(i % 1000)
		t.SetClusterPolicy(cnp.Name, cnp)
	}, func(t *cluster.Tracker, _ *cluster.State, i int) {
		t.SetClusterPolicy(fmt.Sprintf("added-%d", i), nil)
	}},
	{"cnp-cluster-wide-added", func(t *cluster.Tracker, _ *cluster.State, i int) {
		// Selects every pod: every local pod's group of the tier changes.
		cnp := synth.ClusterPolicy(2)
		cnp.Name = fmt.Sprintf("added-%d", i)
		cnp.Spec.Priority = int32(i % 1000)
		t.SetClusterPolicy(cnp.Name, cnp)
	}, func(t *cluster.Tracker, _ *cluster.State, i int) {
		t.SetClusterPolicy(fmt.Sprintf("added-%d", i), nil)
	}},
	{"cnp-priority-changed", func(t *cluster.Tracker, base *cluster.State, i int) {
		// A cluster-wide admin policy moves behind the others: every local pod's group of
		// that tier and direction changes order.
		cnp := base.ClusterPolicies["cnp-00002"].DeepCopy()
		cnp.Spec.Priority = int32(1000 - i%10)
		t.SetClusterPolicy(cnp.Name, cnp)
	}, func(t *cluster.Tracker, base *cluster.State, _ int) {
		t.SetClusterPolicy("cnp-00002", base.ClusterPolicies["cnp-00002"])
	}},
	{"cnp-deleted", func(t *cluster.Tracker, _ *cluster.State, _ int) {
		t.SetClusterPolicy("cnp-00003", nil) // a cluster-wide baseline policy
	}, func(t *cluster.Tracker, base *cluster.State, _ int) {
		t.SetClusterPolicy("cnp-00003", base.ClusterPolicies["cnp-00003"])
	}},
	{"cnp-rule-changed", func(t *cluster.Tracker, base *cluster.State, i int) {
		cnp := base.ClusterPolicies["cnp-00004"].DeepCopy()
		cnp.Spec.Egress[0].Action = []npav1beta1.ClusterNetworkPolicyRuleAction{
			npav1beta1.ClusterNetworkPolicyRuleActionDeny, npav1beta1.ClusterNetworkPolicyRuleActionPass}[i%2]
		cnp.ObjectMeta = metav1.ObjectMeta{Name: cnp.Name}
		t.SetClusterPolicy(cnp.Name, cnp)
	}, func(t *cluster.Tracker, base *cluster.State, _ int) {
		t.SetClusterPolicy("cnp-00004", base.ClusterPolicies["cnp-00004"])
	}},
}

// BenchmarkClusterPolicies measures the nftables backend with 1,000 ClusterNetworkPolicies on
// top of the 10,000 NetworkPolicies of the benchmark cluster: a full sync into an empty node,
// single ClusterNetworkPolicy events from the source to the kernel, and the new-connection
// rate against no rules (targets: full sync <= 1.5 s, event p50 <= 10 ms, ratio >= 0.9).
func BenchmarkClusterPolicies(b *testing.B) {
	requireRoot(b)
	spec := clusterPolicySpec()
	st := synth.Generate(spec)
	b.Run("fullsync", func(b *testing.B) {
		bed := newBed(b)
		var compile, apply time.Duration
		var stats nftables.Stats
		var cstats policy.Stats
		for b.Loop() {
			inNode(b, bed, func() error {
				be, err := nftables.New()
				if err != nil {
					return err
				}
				if err := be.Cleanup(context.Background()); err != nil {
					return err
				}
				start := time.Now()
				var rs *policy.Ruleset
				rs, cstats = policy.NewCompiler(spec.LocalNode).Compile(st)
				r := nftables.Render(rs)
				compile = time.Since(start)
				start = time.Now()
				if _, err := be.FullSyncRendered(context.Background(), r); err != nil {
					return err
				}
				apply = time.Since(start)
				stats = r.Stats()
				return be.Cleanup(context.Background())
			})
		}
		if cstats.ClusterPoliciesSelecting == 0 {
			b.Fatal("no ClusterNetworkPolicy selects a local pod")
		}
		b.ReportMetric(ms(compile), "compile-ms")
		b.ReportMetric(ms(apply), "apply-ms")
		b.ReportMetric(ms(compile+apply), "fullsync-ms")
		b.ReportMetric(float64(cstats.ClusterPoliciesSelecting), "cnps-selecting")
		b.ReportMetric(float64(stats.Chains), "chains")
		b.ReportMetric(float64(stats.Rules), "rules")
	})
	for _, ch := range clusterPolicyChanges {
		b.Run("incremental/"+ch.name, func(b *testing.B) {
			benchIncremental(b, spec.LocalNode, st, ch, func() (policy.Backend, error) { return nftables.New() })
		})
	}
	b.Run("connrate", func(b *testing.B) {
		connRate(b, spec, func() (policy.Backend, error) { return nftables.New() })
	})
}

// BenchmarkIPTablesClusterPolicies is BenchmarkClusterPolicies on the iptables backend, for
// each variant: full sync and single events (the connection rate runs with
// BenchmarkIPTablesConnRate's cluster, without ClusterNetworkPolicies, to keep `make bench`
// within its time).
func BenchmarkIPTablesClusterPolicies(b *testing.B) {
	requireRoot(b)
	spec := clusterPolicySpec()
	st := synth.Generate(spec)
	for _, mode := range iptablesModes {
		b.Run(string(mode)+"/fullsync", func(b *testing.B) {
			bed := newBed(b)
			var compile, apply time.Duration
			for b.Loop() {
				inNode(b, bed, func() error {
					be, err := newIPTables(mode)
					if err != nil {
						return err
					}
					if err := be.Cleanup(context.Background()); err != nil {
						return err
					}
					start := time.Now()
					rs, _ := policy.NewCompiler(spec.LocalNode).Compile(st)
					r := iptables.Render(rs)
					compile = time.Since(start)
					start = time.Now()
					if _, err := be.FullSyncRendered(context.Background(), r); err != nil {
						return err
					}
					apply = time.Since(start)
					return be.Cleanup(context.Background())
				})
			}
			b.ReportMetric(ms(compile), "compile-ms")
			b.ReportMetric(ms(apply), "apply-ms")
			b.ReportMetric(ms(compile+apply), "fullsync-ms")
		})
		for _, ch := range clusterPolicyChanges {
			b.Run(string(mode)+"/incremental/"+ch.name, func(b *testing.B) {
				benchIncremental(b, spec.LocalNode, st, ch, func() (policy.Backend, error) { return newIPTables(mode) })
			})
		}
	}
}
