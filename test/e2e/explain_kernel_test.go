package e2e

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestExplainKernel proves explain --kernel on each backend, the one the agent programmed
// found without being told: it agrees with a correctly programmed node, through the Admin
// tier's dispatch too, and reports a mismatch once the server's dispatch is gone.
func TestExplainKernel(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", map[string]string{"ns": "x"})
		w.addPod(t, "x", "server", map[string]string{"app": "server"}, cport("web", 80, tcp))
		w.addPod(t, "x", "friend", map[string]string{"app": "friend"})
		w.addPod(t, "x", "stranger", map[string]string{"app": "stranger"})
		w.policies["x/web"] = withIngress(netpol("x", "web", sel("app", "server")), from(peers(podPeer(selp("app", "friend"))), port(tcp, 80)))
		if err := w.sim.StartAgent(); err != nil {
			t.Fatal(err)
		}
		cnp := &npav1beta1.ClusterNetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: "fence"},
			Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 1,
				Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{
					NamespaceSelector: metav1.LabelSelector{}, PodSelector: sel("app", "friend")}},
				Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Name: "no-stranger", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
					To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Pods: &npav1beta1.NamespacedPod{NamespaceSelector: metav1.LabelSelector{}, PodSelector: sel("app", "stranger")}}}}}},
		}
		if err := w.sim.Apply(append(w.objects(), cnp)...); err != nil {
			t.Fatal(err)
		}
		// Stopped first, so that no resync repairs the kernel before explain looks.
		if err := w.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		dst := w.tpods["x/server"].IPv4
		explain := func(from string) (string, error) {
			return w.sim.RunAgent(ctx, "explain", "--kernel", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName,
				"--from", from, "--to", "x/server", "--port", "80/tcp")
		}
		for _, from := range []string{"x/stranger", "x/friend"} {
			out, err := explain(from)
			if err != nil || strings.Contains(out, "KERNEL MISMATCH") || strings.Count(out, "kernel: agrees") != 2 {
				t.Fatalf("explain --kernel --from %s on an agreeing kernel: %v\n%s", from, err, out)
			}
			if !strings.Contains(out, "kernel of node "+w.sim.NodeName+": "+be.name+" backend") {
				t.Errorf("explain --kernel did not find the %s backend:\n%s", be.name, out)
			}
			var want []string
			if be.iptables() {
				want = []string{"chain NETWARDEN-INGRESS leads " + dst.String() + " to NETWARDEN-G-", "ipset netwarden-p4-"}
				if from == "x/friend" {
					want = append(want, "chain NETWARDEN-ADMIN-EGRESS leads "+w.tpods[from].IPv4.String()+" to NETWARDEN-A-")
				}
			} else {
				want = []string{"maps " + dst.String() + " to jump grp-ingress-", "set "}
			}
			for _, s := range want {
				if !strings.Contains(out, s) {
					t.Errorf("explain --kernel --from %s does not check %q:\n%s", from, s, out)
				}
			}
		}

		deleteDispatch(t, w, be, dst.String())
		out, err := explain("x/stranger")
		mismatch := "KERNEL MISMATCH: want: map dispatch-in-v4 maps " + dst.String()
		if be.iptables() {
			mismatch = "KERNEL MISMATCH: want: chain NETWARDEN-INGRESS leads " + dst.String() + " to NETWARDEN-G-"
		}
		if err == nil || !strings.Contains(out, mismatch) {
			t.Fatalf("explain --kernel with the server's dispatch gone: %v, want %q and an error:\n%s", err, mismatch, out)
		}

		// With nothing of ours in the kernel there is nothing to check against: explain says so
		// rather than reporting every fact as a mismatch.
		if out, err := w.sim.RunAgent(ctx, "cleanup"); err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		out, err = explain("x/stranger")
		if err == nil || !strings.Contains(out, "no NetworkPolicy backend of netwarden is programmed") || strings.Contains(out, "KERNEL MISMATCH") {
			t.Fatalf("explain --kernel on a node with no backend programmed: %v, want an error saying so:\n%s", err, out)
		}
	})
}

// deleteDispatch removes the rule (or map element) that leads ingress to addr to its
// NetworkPolicy group, in the test node's network namespace only.
func deleteDispatch(t *testing.T, w *world, be backend, addr string) {
	t.Helper()
	ctx := context.Background()
	if !be.iptables() {
		if o, err := w.sim.Nft("delete", "element", "inet", "netwarden", "dispatch-in-v4", "{", addr, "}"); err != nil {
			t.Fatalf("%v: %s", err, o)
		}
		return
	}
	out, err := w.sim.Bed.NodeExec(ctx, "iptables-"+be.mode+"-save", "-t", "mangle")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// The rule sits in the root or in the chain of the server's block of addresses.
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 6 && f[0] == "-A" && f[2] == "-d" && f[3] == addr+"/32" && strings.HasPrefix(f[5], "NETWARDEN-G-") {
			f[0] = "-D"
			if o, err := w.sim.Bed.NodeExec(ctx, "iptables-"+be.mode, append([]string{"-w", "-t", "mangle"}, f...)...); err != nil {
				t.Fatalf("%v: %s", err, o)
			}
			return
		}
	}
	t.Fatalf("no ingress dispatch rule for %s in iptables-%s:\n%s", addr, be.mode, out)
}

// TestExplainKernelAfterChanges: on an agent that has applied a few rounds of changes, the
// groups in the kernel carry the names they inherited (a group whose policies change keeps
// its name, so that its pods' dispatch stays in place), while explain compiles the state
// afresh and names them by their content. explain --kernel must still agree: it judges what
// the group a pod is dispatched to does, not what it is called.
func TestExplainKernelAfterChanges(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", map[string]string{"ns": "x"})
		for _, p := range []string{"a", "b", "c"} {
			w.addPod(t, "x", p, map[string]string{"pod": p}, cport("web", 80, tcp))
		}
		// With drop logging, whose rules name the groups too.
		if err := w.sim.StartAgent("--log-drops"); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		explainAll := func(round string) {
			t.Helper()
			for _, from := range []string{"x/a", "x/b"} {
				out, err := w.sim.RunAgent(ctx, "explain", "--kernel", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName,
					"--from", from, "--to", "x/c", "--port", "80/tcp")
				if err != nil || strings.Contains(out, "KERNEL MISMATCH") || !strings.Contains(out, "kernel: agrees") {
					t.Fatalf("%s: explain --kernel --from %s: %v\n%s", round, from, err, out)
				}
			}
		}
		// Every round changes the policies that select all of x's pods, so their one group
		// changes its content and keeps its name.
		w.policies["x/all"] = withIngress(netpol("x", "all", sel()), from(peers(podPeer(selp("pod", "a")))))
		w.apply(t)
		explainAll("one policy")
		w.policies["x/all-too"] = withIngress(netpol("x", "all-too", sel()), from(peers(podPeer(selp("pod", "b"))), port(tcp, 80)))
		w.apply(t)
		w.check(t, "two policies")
		explainAll("two policies")
		delete(w.policies, "x/all")
		w.apply(t)
		w.check(t, "the first removed")
		explainAll("the first removed")
		if be.iptables() {
			return
		}
		// A chain of another content in the pod's place is still a mismatch. Stopped first, so
		// that no repair undoes it before explain looks.
		if err := w.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		c := w.tpods["x/c"].IPv4.String()
		for _, args := range [][]string{{"delete", "element", "inet", "netwarden", "dispatch-in-v4", "{", c, "}"},
			{"add", "element", "inet", "netwarden", "dispatch-in-v4", "{", c, ":", "jump", "in/x/all-too-v4", "}"}} {
			if o, err := w.sim.Nft(args...); err != nil {
				t.Fatalf("nft %v: %v: %s", args, err, o)
			}
		}
		out, err := w.sim.RunAgent(ctx, "explain", "--kernel", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName,
			"--from", "x/a", "--to", "x/c", "--port", "80/tcp")
		if want := "KERNEL MISMATCH: want: map dispatch-in-v4 maps " + c; err == nil || !strings.Contains(out, want) || !strings.Contains(out, "which is no grp-ingress-*-v4 chain") {
			t.Fatalf("explain --kernel with x/c dispatched to a policy's chain: %v, want %q saying it is no group of the stage:\n%s", err, want, out)
		}
	})
}
