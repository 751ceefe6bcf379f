package policy

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// TestStagedPolicies: a policy annotated staged changes no verdict, in a fresh compile and in
// an incremental one that follows the annotation being added and removed; compiled as written,
// it judges as it will once enforced.
func TestStagedPolicies(t *testing.T) {
	st := testState()
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "deny-db"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	cluster.DefaultNetworkPolicy(deny)
	staged := deny.DeepCopy()
	staged.Annotations = map[string]string{StagedAnnotation: "true"}
	db, client := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.1.1")
	allowed := func(rs *Ruleset) bool { return rs.Judge(Ingress, db, client, TCP, 5432).Allowed }

	st.Policies["a/deny-db"] = staged
	rs, stats := Compile(st, "n1")
	if !allowed(rs) || stats.Staged != 1 {
		t.Fatalf("a staged deny changed the verdict (allowed %v, %d staged)", allowed(rs), stats.Staged)
	}
	if written, _ := CompileAsWritten(st, "n1"); allowed(written) {
		t.Fatal("compiled as written, the staged deny does not deny")
	}
	nps, cnps := Staged(st)
	if len(nps) != 1 || nps[0] != "a/deny-db" || len(cnps) != 0 {
		t.Fatalf("Staged: %v %v", nps, cnps)
	}

	// Incremental: the tracker names each change, and the compiler follows the annotation.
	objects := cluster.NewTrackerFrom(testState())
	cc := NewCompiler("n1")
	for i, step := range []struct {
		np   *networkingv1.NetworkPolicy
		want bool
	}{{staged, true}, {deny, false}, {staged, true}, {nil, true}} {
		if step.np == nil {
			objects.SetPolicy("a/deny-db", nil)
		} else {
			objects.SetPolicy("a/deny-db", step.np)
		}
		snap := objects.Snapshot()
		if i > 0 && snap.Changes == nil {
			t.Fatal("the tracker named no change: the test would not take the incremental path")
		}
		if rs, _ := cc.Compile(snap); allowed(rs) != step.want {
			t.Fatalf("step %d: allowed %v, want %v", i, allowed(rs), step.want)
		}
	}
}
