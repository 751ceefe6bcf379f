package policy

import (
	"errors"
	"maps"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// TestFailClosed: a rejected policy loses its chains and the sets only it used; the pods it
// selects keep their groups (so stay isolated), and the other policies are untouched.
func TestFailClosed(t *testing.T) {
	st := testState()
	// a/db-both selects both pods in both directions and is rejected; a/web shares the
	// web pod's ingress group with it.
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "db-both"},
		Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{}},
		},
	}
	cluster.DefaultNetworkPolicy(np)
	st.Policies["a/db-both"] = np
	rs, _ := Compile(st, "n1")
	before := len(rs.Policies)

	same, none := FailClosed(rs, func(string, *PolicyRules) error { return nil })
	if same != rs || none != nil {
		t.Fatal("with nothing rejected, the ruleset must come back as it is")
	}

	asked := 0
	out, skipped := FailClosed(rs, func(chain string, pr *PolicyRules) error {
		asked++
		if chain == PolicyChainName(Egress, "a", "db-both") {
			return errors.New("cannot express this")
		}
		return nil
	})
	if len(skipped) != 1 || skipped[0] != (SkippedPolicy{Policy: "a/db-both", Reason: "cannot express this"}) {
		t.Fatalf("skipped %+v", skipped)
	}
	if asked == 0 || len(rs.Policies) != before {
		t.Fatal("the input ruleset was changed")
	}
	for chain := range out.Policies {
		if out.Policies[chain].Source == "a/db-both" {
			t.Errorf("chain %s of the skipped policy kept (both directions go)", chain)
		}
	}
	if out.Policies[PolicyChainName(Ingress, "a", "web")] == nil {
		t.Error("a/web lost its rules")
	}
	// Isolation is unchanged: same dispatch, same groups, minus the skipped chains.
	if !maps.Equal(out.Dispatch[Ingress], rs.Dispatch[Ingress]) || !maps.Equal(out.Dispatch[Egress], rs.Dispatch[Egress]) {
		t.Error("dispatch changed")
	}
	if len(out.Groups) != len(rs.Groups) {
		t.Fatalf("groups %d, want %d", len(out.Groups), len(rs.Groups))
	}
	emptied := 0
	for name, g := range out.Groups {
		for _, c := range g.Policies {
			if out.Policies[c] == nil {
				t.Errorf("group %s still holds %s", name, c)
			}
		}
		if len(g.Policies) == 0 {
			emptied++ // judged by nothing but the final drop
		}
		if len(rs.Groups[name].Policies) < len(g.Policies) {
			t.Errorf("group %s grew", name)
		}
	}
	if emptied == 0 {
		t.Error("the pods only the skipped policy selected must keep an (empty) group: they stay isolated")
	}
	for _, g := range rs.Groups {
		if !slices.ContainsFunc(g.Policies, func(c string) bool { return rs.Policies[c].Source == "a/db-both" }) {
			continue
		}
		if len(g.Policies) == 0 {
			t.Error("the input's groups were changed")
		}
	}
	// The sets only the skipped policy used go; the ones a/web uses stay.
	if len(out.CIDRSets) != 1 || len(rs.CIDRSets) != 2 {
		t.Errorf("cidr sets: %d of %d kept, want a/web's one", len(out.CIDRSets), len(rs.CIDRSets))
	}
	if len(out.AddrSets) != 1 || len(rs.AddrSets) != 2 {
		t.Errorf("addr sets: %d of %d kept, want a/web's one", len(out.AddrSets), len(rs.AddrSets))
	}
	if len(out.NamedPortSets) != len(rs.NamedPortSets) {
		t.Error("a/web's named-port set dropped")
	}
}

// TestFailClosedKeepsStagedSets: the sets only a staged judge names stay when a policy is
// skipped, since the judge's rules still name them.
func TestFailClosedKeepsStagedSets(t *testing.T) {
	st := testState()
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "staged-from-db", Annotations: map[string]string{StagedAnnotation: "true"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"only": "staged"}}}}}},
		},
	}
	cluster.DefaultNetworkPolicy(np)
	st.Policies["a/staged-from-db"] = np
	rs, _ := Compile(st, "n1")
	if rs.Staged == nil {
		t.Fatal("no staged judgement")
	}
	var judged []string
	for _, j := range rs.Staged.Judges {
		for _, seg := range j.Segments {
			for _, r := range seg.Rules {
				for _, p := range r.Peers {
					if p.AddrSet != "" {
						judged = append(judged, p.AddrSet)
					}
				}
			}
		}
	}
	if len(judged) == 0 {
		t.Fatal("the judges name no set: the test proves nothing")
	}
	out, skipped := FailClosed(rs, func(string, *PolicyRules) error { return errors.New("rejected") })
	if len(skipped) == 0 {
		t.Fatal("nothing skipped")
	}
	for _, name := range judged {
		if out.AddrSets[name] == nil {
			t.Errorf("set %s, named by a staged judge, was dropped", name)
		}
	}
}
