package policy_test

import (
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// BenchmarkCompileOneLabelChange measures compiling a snapshot in which one local pod's labels
// changed, the compile part of the most common event.
func BenchmarkCompileOneLabelChange(b *testing.B) {
	spec := synth.Default()
	base := synth.Generate(spec)
	key := cluster.Key("ns-00001", "pod-000001")
	changed := base.Clone()
	p := clonePod(changed.Pods.Get(key))
	p.Labels["app"] = "app-5"
	changed.Pods.Set(key, p)
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

// BenchmarkCompileOneClusterPolicyChange measures compiling the snapshot after one of 1,000
// ClusterNetworkPolicies changed a rule's action, as the agent's tracker hands it over (with
// the change named), the compile part of a CNP event.
func BenchmarkCompileOneClusterPolicyChange(b *testing.B) {
	spec := synth.Default()
	spec.ClusterPolicies = 1000
	base := synth.Generate(spec)
	orig := base.ClusterPolicies["cnp-00004"]
	changed := orig.DeepCopy()
	changed.Spec.Egress[0].Action = "Deny"
	objects := cluster.NewTrackerFrom(base)
	c := policy.NewCompiler(spec.LocalNode)
	c.Compile(objects.Snapshot())
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			objects.SetClusterPolicy(changed.Name, changed)
		} else {
			objects.SetClusterPolicy(orig.Name, orig)
		}
		c.Compile(objects.Snapshot())
		i++
	}
}
