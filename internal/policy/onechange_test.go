package policy_test

import (
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/synth"
)

// BenchmarkCompileOneLabelChange measures compiling a snapshot in which one local pod's labels
// changed, the compile part of the most common event.
func BenchmarkCompileOneLabelChange(b *testing.B) {
	spec := synth.Default()
	base := synth.Generate(spec)
	key := cluster.Key("ns-00001", "pod-000001")
	changed := base.Clone()
	p := changed.Pods[key].DeepCopy()
	p.Labels["app"] = "app-5"
	changed.Pods[key] = p
	c := policy.NewCompiler(spec.LocalNode)
	c.Compile(base)
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			c.Compile(changed)
		} else {
			c.Compile(base)
		}
		i++
	}
}
