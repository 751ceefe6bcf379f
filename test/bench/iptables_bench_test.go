package bench

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/synth"
	"github.com/netwarden/netwarden/internal/xtables"
)

// The iptables backend on the same synthetic cluster and test bed as the nftables figures,
// for both iptables variants.

var iptablesModes = []xtables.Mode{xtables.ModeNFT, xtables.ModeLegacy}

func newIPTables(mode xtables.Mode) (*iptables.Backend, error) {
	return iptables.New(context.Background(), mode)
}

// BenchmarkIPTablesFullSync measures compile, render and one full sync (ipset restore, one
// iptables-restore per family) into an empty node.
func BenchmarkIPTablesFullSync(b *testing.B) {
	requireRoot(b)
	for _, mode := range iptablesModes {
		for _, k := range []int{1, 10} {
			b.Run(fmt.Sprintf("%s/scale=%dx", mode, k), func(b *testing.B) {
				spec := synth.Default().Scale(k)
				st := synth.Generate(spec)
				bed := newBed(b)
				var compile, apply time.Duration
				var size struct{ chains, rules, sets, elements int }
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
						res, err := be.FullSyncRendered(context.Background(), r)
						if err != nil {
							return err
						}
						apply = time.Since(start)
						size.chains, size.rules, size.sets, size.elements = res.Size.Chains, res.Size.Rules, res.Size.Sets, res.Size.Elements
						return be.Cleanup(context.Background())
					})
				}
				b.ReportMetric(ms(compile), "compile-ms")
				b.ReportMetric(ms(apply), "apply-ms")
				b.ReportMetric(ms(compile+apply), "fullsync-ms")
				b.ReportMetric(float64(size.chains), "chains")
				b.ReportMetric(float64(size.rules), "rules")
				b.ReportMetric(float64(size.sets), "sets")
				b.ReportMetric(float64(size.elements), "elements")
			})
		}
	}
}

// BenchmarkIPTablesIncremental measures the same single changes as BenchmarkIncremental, each
// from the new snapshot to the kernel updated.
func BenchmarkIPTablesIncremental(b *testing.B) {
	requireRoot(b)
	for _, mode := range iptablesModes {
		for _, k := range []int{1, 10} {
			spec := synth.Default().Scale(k)
			base := synth.Generate(spec)
			for _, ch := range changes {
				b.Run(fmt.Sprintf("%s/scale=%dx/%s", mode, k, ch.name), func(b *testing.B) {
					benchIncremental(b, spec.LocalNode, base, ch, func() (dataplane.PolicyBackend, error) { return newIPTables(mode) })
				})
			}
		}
	}
}

// BenchmarkIPTablesConnRate is BenchmarkConnRate on the iptables backend: new TCP connections
// per second through the node with no rules, with our chains but no policy, and with the whole
// benchmark cluster's policies loaded, alternating in one run.
func BenchmarkIPTablesConnRate(b *testing.B) {
	requireRoot(b)
	for _, mode := range iptablesModes {
		b.Run(string(mode), func(b *testing.B) {
			bed := newBed(b)
			server, err := bed.AddPod("ns-00000", "pod-000000")
			if err != nil {
				b.Fatal(err)
			}
			client, err := bed.AddPod("ns-00001", "pod-000001")
			if err != nil {
				b.Fatal(err)
			}
			spec := synth.Default()
			spec.LocalIPs = []netip.Addr{server.IPv4, client.IPv4}
			st := synth.Generate(spec)
			allowLast(st, "ns-00000", "ns-00001")
			rs, stats := policy.Compile(st, spec.LocalNode)
			if stats.IsolatedPods == 0 {
				b.Fatal("no pod isolated")
			}
			dst := netip.AddrPortFrom(server.IPv4, 80)
			if n := connect(b, client, dst, 300*time.Millisecond, 1); n == 0 {
				b.Fatal("client cannot reach server without rules")
			}
			empty, _ := policy.Compile(cluster.NewState(), spec.LocalNode)
			load := func(rs *policy.Ruleset) {
				inNode(b, bed, func() error {
					be, err := newIPTables(mode)
					if err != nil {
						return err
					}
					if rs == nil {
						return be.Cleanup(context.Background())
					}
					_, err = be.FullSync(context.Background(), rs)
					return err
				})
			}
			load(rs)
			if n := connect(b, client, dst, 300*time.Millisecond, 1); n == 0 {
				b.Fatal("client cannot reach server with the policies that allow it")
			}
			var without, hooks, with []float64
			for b.Loop() {
				for round := 0; round < 7; round++ {
					load(nil)
					settle()
					without = append(without, connect(b, client, dst, 3*time.Second, 4))
					load(empty)
					settle()
					hooks = append(hooks, connect(b, client, dst, 3*time.Second, 4))
					load(rs)
					settle()
					with = append(with, connect(b, client, dst, 3*time.Second, 4))
				}
			}
			median := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
			mw, mh, mo := median(with), median(hooks), median(without)
			b.ReportMetric(mo, "conn/s-no-rules")
			b.ReportMetric(mh, "conn/s-hooks-only")
			b.ReportMetric(mw, "conn/s-10k-policies")
			b.ReportMetric(mw/mo, "ratio")
			b.ReportMetric(mw/mh, "ratio-vs-hooks")
			load(nil)
		})
	}
}
