package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
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
					benchIncremental(b, spec.LocalNode, base, ch, func() (policy.Backend, error) { return newIPTables(mode) })
				})
			}
		}
	}
}

// BenchmarkIPTablesConnRate is BenchmarkConnRate on the iptables backend, for each variant.
func BenchmarkIPTablesConnRate(b *testing.B) {
	for _, mode := range iptablesModes {
		b.Run(string(mode), func(b *testing.B) {
			connRate(b, synth.Default(), func() (policy.Backend, error) { return newIPTables(mode) })
		})
	}
}
