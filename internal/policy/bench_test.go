package policy_test

import (
	"fmt"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/synth"
)

// BenchmarkCompile measures a full compile of the benchmark cluster for one node.
func BenchmarkCompile(b *testing.B) {
	for _, k := range []int{1, 10} {
		spec := synth.Default().Scale(k)
		st := synth.Generate(spec)
		b.Run(fmt.Sprintf("scale=%dx", k), func(b *testing.B) {
			var stats policy.Stats
			var rs *policy.Ruleset
			// The agent keeps one Compiler; unchanged objects are not parsed again.
			c := policy.NewCompiler(spec.LocalNode)
			for b.Loop() {
				rs, stats = c.Compile(st)
			}
			b.ReportMetric(float64(stats.IsolatedPods), "isolated-pods")
			b.ReportMetric(float64(stats.PoliciesSelecting), "policies-selecting")
			b.ReportMetric(float64(len(rs.AddrSets)), "addr-sets")
		})
	}
}
