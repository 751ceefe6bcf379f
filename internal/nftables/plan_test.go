package nftables

import (
	"fmt"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/synth"
)

// TestWholeGroupChangesKeepDispatch checks the plans of changes that alter the policies of
// every local pod (a ClusterNetworkPolicy whose subject is every namespace, added, moved in
// priority, deleted): the groups keep their names, so the plan rewrites group chains and adds
// the policy's chains but touches no dispatch element.
func TestWholeGroupChangesKeepDispatch(t *testing.T) {
	spec := synth.Default()
	spec.Namespaces, spec.Pods, spec.Policies, spec.LocalPods, spec.ClusterPolicies = 100, 500, 1000, 60, 100
	st := synth.Generate(spec)
	cc := policy.NewCompiler(spec.LocalNode)
	var rd Renderer
	rs, _ := cc.Compile(st)
	prev := rd.Render(rs)

	wide := synth.ClusterPolicy(2) // subject: every namespace
	if wide.Spec.Subject.Namespaces == nil {
		t.Fatal("synth.ClusterPolicy(2) no longer selects every namespace; pick another")
	}
	steps := []struct {
		what   string
		change func()
	}{
		{"cluster-wide policy added", func() {
			p := wide.DeepCopy()
			p.Name = "added"
			st.ClusterPolicies[p.Name] = p
		}},
		{"its priority changed", func() {
			p := st.ClusterPolicies["added"].DeepCopy()
			p.Spec.Priority = 1000 - p.Spec.Priority
			st.ClusterPolicies[p.Name] = p
		}},
		{"it is deleted", func() { delete(st.ClusterPolicies, "added") }},
	}
	for _, step := range steps {
		st = st.Clone()
		step.change()
		rs, _ := cc.Compile(st)
		next := rd.Render(rs)
		p := diff(prev, next)
		var touched []string
		for _, e := range p.elems {
			if strings.HasPrefix(e.set, "tier-") || strings.HasPrefix(e.set, "dispatch-") {
				touched = append(touched, fmt.Sprintf("%s %s", e.set, e.key))
			}
		}
		if len(touched) > 0 {
			t.Errorf("%s: %d dispatch elements re-pointed, want none: %v", step.what, len(touched), touched[:min(5, len(touched))])
		}
		if len(p.rewrite) == 0 {
			t.Errorf("%s: no chain rewritten", step.what)
		}
		t.Logf("%s: %d operations (%d chains rewritten, %d new, %d gone)", step.what, p.operations(next), len(p.rewrite), len(p.newChains), len(p.goneChains))
		prev = next
	}
}
