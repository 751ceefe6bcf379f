package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestStagedPolicyChangesNoVerdict: a NetworkPolicy annotated staged is in the cluster state
// the agent reads and changes no packet's fate; explain --staged says what it would change;
// removing the annotation enforces it with one change.
func TestStagedPolicyChangesNoVerdict(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", map[string]string{"ns": "x"})
		w.addPod(t, "x", "a", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		w.addPod(t, "x", "b", map[string]string{"pod": "b"}, cport("web", 80, tcp))
		if err := w.sim.StartAgent(); err != nil {
			t.Fatal(err)
		}
		w.apply(t)
		w.check(t, "no policy")

		deny := netpol("x", "deny-a", sel("pod", "a"))
		staged := deny.DeepCopy()
		staged.Annotations = map[string]string{policy.StagedAnnotation: "true"}
		// Written beside the world's objects, not into its policies: the oracle judges as if
		// there were no such policy, which is what staged means.
		if err := w.sim.Apply(append(w.objects(), staged)...); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		w.check(t, "the deny staged")
		out, err := w.sim.RunAgent(context.Background(), "explain", "--staged", "--manifests", w.sim.Dir,
			"--from", "x/b", "--to", "x/a", "--port", "80/tcp")
		if err != nil || !strings.Contains(out, "staged:  would-deny") || !strings.Contains(out, "x/deny-a") {
			t.Fatalf("explain --staged: %v\n%s", err, out)
		}

		w.policies["x/deny-a"] = deny
		w.apply(t)
		w.check(t, "the deny enforced")
	})
}
