package nftables

import (
	"fmt"
	"maps"
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// BenchmarkOneLabelChanged measures the agent's in-process work for one local pod's label
// changed at the benchmark's scale (as BenchmarkManifestsDirectory changes it): compile,
// render and diff, everything of a sync but the kernel's share.
func BenchmarkOneLabelChanged(b *testing.B) {
	spec := synth.Default()
	base := synth.Generate(spec)
	objects := cluster.NewTrackerFrom(base)
	cc := policy.NewCompiler(spec.LocalNode)
	var rd Renderer
	rs, _ := cc.Compile(objects.Snapshot())
	prev := rd.Render(rs)
	pod := base.Pods.Get("ns-00001/pod-000001")
	i := 0
	for b.Loop() {
		p := *pod
		p.Labels = maps.Clone(pod.Labels)
		p.Labels["app"] = fmt.Sprintf("app-%d", 1+i%9)
		objects.SetPod("ns-00001/pod-000001", &p)
		rs, _ := cc.Compile(objects.Snapshot())
		next := rd.Render(rs)
		diff(prev, next)
		prev = next
		i++
	}
}
