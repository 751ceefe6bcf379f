package nftables

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
)

// stagedState stages the NetworkPolicy and the admin ClusterNetworkPolicy of
// clusterPolicyState: both tiers, Pass and Deny rules, and a NetworkPolicy whose isolation is
// staged.
func stagedState(n int) *cluster.State {
	st := clusterPolicyState(n, 10)
	for _, np := range st.Policies {
		np.Annotations = map[string]string{policy.StagedAnnotation: "true"}
	}
	st.ClusterPolicies["guard"].Annotations = map[string]string{policy.StagedAnnotation: "true"}
	return st
}

// TestKernelStagedJudgement loads a Ruleset with staged policies, changes it over netlink,
// and checks that the table is what a full sync through nft writes; the enforcing chains
// drop through the staged-denied chains only while some policy is staged.
func TestKernelStagedJudgement(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		b.SetStagedLog(&policy.DropLog{Group: 7, Rate: 5, Burst: 5})
		rs, _ := policy.Compile(stagedState(2), "n1")
		if rs.Staged == nil || len(rs.Staged.Judges) == 0 {
			t.Fatal("no staged judge: the test proves nothing")
		}
		if _, err := b.FullSync(ctx, rs); err != nil {
			t.Fatalf("full sync: %v", err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify: %v", err)
		}
		out, _ := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
		for _, want := range []string{"chain staged-egress", "type filter hook prerouting priority filter + 1", "chain staged-ingress",
			"goto staged-denied-in", "map staged-in-a-v4", "map staged-out-d-v6", "chain staged-wd-", "chain staged-wa-", `log prefix "nw:sd-`} {
			if !strings.Contains(string(out), want) {
				t.Errorf("table lacks %q:\n%s", want, out)
			}
		}
		// A third pod: judge map elements, and chains, over netlink.
		rs2, _ := policy.Compile(stagedState(3), "n1")
		if res, err := b.Sync(ctx, rs2); err != nil {
			t.Fatalf("sync: %+v %v", res, err)
		}
		incremental, incrementalExprs := listCanonical(t), ruleExprs(t)
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after the sync: %v", err)
		}
		if _, err := b.FullSync(ctx, rs2); err != nil {
			t.Fatal(err)
		}
		if full := listCanonical(t); incremental != full {
			t.Fatalf("tables differ.\nincremental:\n%s\nfull:\n%s", incremental, full)
		}
		if fullExprs := ruleExprs(t); incrementalExprs != fullExprs {
			t.Fatalf("rule expressions differ.\nincremental:\n%s\nfull:\n%s", incrementalExprs, fullExprs)
		}
		// Every policy enforced: no staged chain, and drops are drops again.
		rs3, _ := policy.Compile(clusterPolicyState(3, 10), "n1")
		if _, err := b.Sync(ctx, rs3); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after the policies were enforced: %v", err)
		}
		out, _ = exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
		if strings.Contains(string(out), "staged") {
			t.Fatalf("staged chains or gotos left once no policy is staged:\n%s", out)
		}
		if err := b.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
