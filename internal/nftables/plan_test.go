package nftables

import (
	"fmt"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
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

// TestNewIntervalSetsOverNetlink: a new ipBlock set goes over netlink unless one of its
// ranges reaches the family's highest address (nft marks that one open in user data) or two
// ranges overlap; a change to an existing interval set never does.
func TestNewIntervalSetsOverNetlink(t *testing.T) {
	for _, tc := range []struct {
		typ   string
		elems []string
		ok    bool
	}{
		{"ipv4_addr", []string{"10.0.0.0/8", "192.0.2.0/25", "192.0.2.128/25", "198.51.100.7"}, true},
		{"ipv6_addr", []string{"2001:db8::/33", "::/8"}, true},
		{"ipv4_addr", []string{"128.0.0.0/1"}, false},
		{"ipv6_addr", []string{"ff00::/8"}, false},
		{"ipv4_addr", []string{"10.0.0.0/8", "10.1.0.0/16"}, false},
	} {
		elems := map[string]string{}
		for _, e := range tc.elems {
			elems[e] = ""
		}
		s := newSet(tc.typ, "ipBlock", elems)
		s.interval = true
		next := &Rendered{Sets: map[string]*set{"cidr-x": s}, Chains: map[string]*chain{}}
		p := diff(&Rendered{Sets: map[string]*set{}, Chains: map[string]*chain{}}, next)
		if got := p.netlinkable(next); got != tc.ok {
			t.Errorf("new set %v: netlinkable %v, want %v", tc.elems, got, tc.ok)
		}
		if !tc.ok {
			continue
		}
		grown := map[string]string{"203.0.113.0/24": ""}
		if tc.typ == "ipv6_addr" {
			grown = map[string]string{"3fff::/20": ""}
		}
		for e := range elems {
			grown[e] = ""
		}
		g := newSet(tc.typ, "ipBlock", grown)
		g.interval = true
		after := &Rendered{Sets: map[string]*set{"cidr-x": g}, Chains: map[string]*chain{}}
		if p := diff(next, after); p.netlinkable(after) {
			t.Errorf("a change to the existing set %v went over netlink", tc.elems)
		}
	}
}
