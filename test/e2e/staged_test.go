package e2e

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

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

const stagedLine = "connection judged otherwise by staged policies"

// stagedReported reports whether the agent logged a staged verdict line containing every
// one of want.
func stagedReported(log string, want ...string) bool {
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, stagedLine) {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestStagedVerdictsInTheKernel: the kernel judges each new connection also as the staged
// policies would, and reports each difference without changing a verdict. A staged ingress
// deny-all of namespace x lets every connection through and reports exactly those to x's
// pods as would-deny; enforced, it blocks exactly those. A staged egress allow beside an
// enforced egress deny-all blocks what it blocked and reports the connections it would let
// through as would-allow; enforced, it lets exactly those through. Both in the log
// (--log-staged) and in netwarden_staged_verdicts_total.
func TestStagedVerdictsInTheKernel(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", map[string]string{"ns": "x"})
		w.addNamespace("y", map[string]string{"ns": "y"})
		w.addPod(t, "x", "a", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		w.addPod(t, "x", "b", map[string]string{"pod": "b"}, cport("web", 80, tcp))
		w.addPod(t, "y", "c", map[string]string{"pod": "c"}, cport("web", 80, tcp))
		// No limit the probes could reach: every reported connection is logged.
		if err := w.sim.StartAgent("--log-staged", "--log-drops-rate", "10000", "--log-drops-burst", "10000"); err != nil {
			t.Fatal(err)
		}
		w.apply(t)
		pods := []string{"x/a", "x/b", "y/c"}
		type pair struct{ src, dst string }
		connect := func(p pair) bool {
			return connectOnce(t, w.tpods[p.src], netip.AddrPortFrom(w.tpods[p.dst].IPv4, 80))
		}
		stage := func(extra ...runtime.Object) {
			t.Helper()
			if err := w.sim.Apply(append(w.objects(), extra...)...); err != nil {
				t.Fatal(err)
			}
			if err := w.sim.WaitApplied(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			if err := w.sim.FlushConntrack(); err != nil {
				t.Fatal(err)
			}
		}
		staged := func(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
			np = np.DeepCopy()
			np.Annotations = map[string]string{policy.StagedAnnotation: "true"}
			return np
		}
		// reported waits for the line of each pair it should report (the kernel logs in
		// order, so the last probe's line comes last), then says which pairs were reported.
		reported := func(pairs []pair, outcome, direction, stagedPolicy string) map[pair]bool {
			t.Helper()
			line := func(p pair) []string {
				return []string{"outcome=" + outcome, "src=" + p.src, "dst=" + p.dst, "direction=" + direction, "stagedPolicies=" + stagedPolicy, "port=80"}
			}
			// A marker: a pair that must be reported, probed last.
			marker := pairs[len(pairs)-1]
			waitFor(t, 10*time.Second, "the staged verdict line of "+marker.src+" -> "+marker.dst, func() bool {
				return stagedReported(w.sim.Log(), line(marker)...)
			})
			out := map[pair]bool{}
			for _, p := range pairs {
				out[p] = stagedReported(w.sim.Log(), line(p)...)
			}
			return out
		}
		var all []pair
		for _, s := range pods {
			for _, d := range pods {
				if s != d {
					all = append(all, pair{s, d})
				}
			}
		}
		// Those to x's pods last, so that the marker is one the deny-all reports.
		slices.SortStableFunc(all, func(p, q pair) int {
			return strings.Compare(strings.Replace(p.dst, "y/", "a/", 1), strings.Replace(q.dst, "y/", "a/", 1))
		})

		// A staged ingress deny-all of namespace x.
		denyAll := netpol("x", "deny-all", sel(), networkingv1.PolicyTypeIngress)
		stage(staged(denyAll))
		for _, p := range all {
			if !connect(p) {
				t.Fatalf("%s -> %s: blocked by a staged policy", p.src, p.dst)
			}
		}
		got := reported(all, policy.WouldDeny, "ingress", "x/deny-all")
		for _, p := range all {
			if want := strings.HasPrefix(p.dst, "x/"); got[p] != want {
				t.Errorf("%s -> %s: reported would-deny %v, want %v", p.src, p.dst, got[p], want)
			}
		}
		// explain --kernel reads a table whose enforcing chains drop through the staged judge.
		out, err := w.sim.RunAgent(context.Background(), "explain", "--kernel", "--staged", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName,
			"--from", "x/b", "--to", "x/a", "--port", "80/tcp")
		if err != nil || !strings.Contains(out, "kernel: agrees") || !strings.Contains(out, "would-deny") {
			t.Errorf("explain --kernel --staged: %v\n%s", err, out)
		}
		series := `netwarden_staged_verdicts_total{outcome="would-deny",policy="x/deny-all"}`
		if n := metricValue(metricsOf(t, w.sim.StatusSocket()), series); n < 4 {
			t.Errorf("%s = %v after 4 connections it would deny, want at least 4", series, n)
		}
		// Enforced, it blocks exactly what was reported.
		w.policies["x/deny-all"] = denyAll
		w.apply(t)
		if err := w.sim.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		for _, p := range all {
			if connect(p) == got[p] {
				t.Errorf("%s -> %s enforced: connected %v, yet reported would-deny %v", p.src, p.dst, !got[p], got[p])
			}
		}
		delete(w.policies, "x/deny-all")

		// An enforced egress deny-all of y/c, and a staged allow to x/a.
		w.policies["y/c-out"] = netpol("y", "c-out", sel("pod", "c"), networkingv1.PolicyTypeEgress)
		allowA := withEgress(netpol("y", "to-a", sel("pod", "c"), networkingv1.PolicyTypeEgress),
			to(peers(nsPodPeer(selp("ns", "x"), selp("pod", "a"))), port(tcp, 80)))
		stage(staged(allowA))
		fromC := []pair{{"y/c", "x/b"}, {"y/c", "x/a"}}
		for _, p := range fromC {
			if connect(p) {
				t.Fatalf("%s -> %s: let through by a staged policy", p.src, p.dst)
			}
		}
		got = reported(fromC, policy.WouldAllow, "egress", "y/to-a")
		if !got[pair{"y/c", "x/a"}] || got[pair{"y/c", "x/b"}] {
			t.Errorf("would-allow reported %v, want only y/c -> x/a", got)
		}
		out, err = w.sim.RunAgent(context.Background(), "explain", "--kernel", "--staged", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName,
			"--from", "y/c", "--to", "x/a", "--port", "80/tcp")
		if err != nil || !strings.Contains(out, "kernel: agrees") || !strings.Contains(out, "would-allow") {
			t.Errorf("explain --kernel --staged on a pod whose drops go through the staged judge: %v\n%s", err, out)
		}
		series = `netwarden_staged_verdicts_total{outcome="would-allow",policy="y/to-a"}`
		if n := metricValue(metricsOf(t, w.sim.StatusSocket()), series); n < 1 {
			t.Errorf("%s = %v, want at least 1", series, n)
		}
		w.policies["y/to-a"] = allowA
		w.apply(t)
		if err := w.sim.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		for _, p := range fromC {
			if connect(p) != got[p] {
				t.Errorf("%s -> %s enforced: connected %v, yet reported would-allow %v", p.src, p.dst, !got[p], got[p])
			}
		}
		delete(w.policies, "y/c-out")
		delete(w.policies, "y/to-a")

		// A staged admin ClusterNetworkPolicy denying x's ingress from y: the difference is
		// blamed on its rule, by name.
		fence := &npav1beta1.ClusterNetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: "fence", Annotations: map[string]string{policy.StagedAnnotation: "true"}},
			Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 1,
				Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: selp("ns", "x")},
				Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{{Name: "no-y", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
					From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: selp("ns", "y")}}}}},
		}
		stage(fence)
		toA := []pair{{"x/b", "x/a"}, {"y/c", "x/a"}}
		for _, p := range toA {
			if !connect(p) {
				t.Fatalf("%s -> %s: blocked by a staged ClusterNetworkPolicy", p.src, p.dst)
			}
		}
		got = reported(toA, policy.WouldDeny, "ingress", "fence")
		if !got[pair{"y/c", "x/a"}] || got[pair{"x/b", "x/a"}] {
			t.Errorf("would-deny reported %v, want only y/c -> x/a", got)
		}
		if !stagedReported(w.sim.Log(), "src=y/c", "stagedPolicies=fence", "no-y") {
			t.Errorf("the staged verdict line does not name the rule no-y:\n%s", grepLines(w.sim.Log(), stagedLine))
		}
		enforced := fence.DeepCopy()
		enforced.Annotations = nil
		stage(enforced)
		for _, p := range toA {
			if connect(p) == got[p] {
				t.Errorf("%s -> %s enforced: connected %v, yet reported would-deny %v", p.src, p.dst, !got[p], got[p])
			}
		}
	})
}
