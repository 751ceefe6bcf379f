package policy_test

import (
	"fmt"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// BenchmarkCompile measures the first, full compile of the benchmark cluster for one node.
func BenchmarkCompile(b *testing.B) {
	for _, k := range []int{1, 10} {
		spec := synth.Default().Scale(k)
		st := synth.Generate(spec)
		b.Run(fmt.Sprintf("scale=%dx", k), func(b *testing.B) {
			var stats policy.Stats
			var rs *policy.Ruleset
			for b.Loop() {
				rs, stats = policy.NewCompiler(spec.LocalNode).Compile(st)
			}
			b.ReportMetric(float64(stats.IsolatedPods), "isolated-pods")
			b.ReportMetric(float64(stats.PoliciesSelecting), "policies-selecting")
			b.ReportMetric(float64(len(rs.AddrSets)), "addr-sets")
		})
	}
}

// BenchmarkCompileNoChange measures the floor of every event: compiling a snapshot in which
// nothing changed, which still walks every pod and policy by pointer.
func BenchmarkCompileNoChange(b *testing.B) {
	spec := synth.Default()
	st := synth.Generate(spec)
	c := policy.NewCompiler(spec.LocalNode)
	c.Compile(st)
	for b.Loop() {
		c.Compile(st)
	}
}
