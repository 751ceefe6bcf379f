package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestForeignChangesRepairedAtOnce: another process flushes, deletes or overrides our rules
// (an admin's `nft flush ruleset`, a tool restoring whole tables, a rule inserted ahead of our
// jump). With nftables and iptables-nft the kernel's change notifications make the agent
// repair at once, with iptables-legacy the poll of its tables' shape: the resync period is a
// minute here, so a repair seen within seconds came from them. The guard's rules (established
// flows a policy denies, pods without verdicts) are repaired as the policy rules are.
func TestForeignChangesRepairedAtOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, true)
		w.addNamespace("x", map[string]string{"ns": "x"})
		w.addNamespace("y", map[string]string{"ns": "y"})
		w.addPod(t, "x", "a", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		w.addPod(t, "x", "b", map[string]string{"pod": "b"}, cport("web", 81, tcp))
		w.addPod(t, "y", "a", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		const bound = 10 * time.Second
		if err := w.sim.StartAgent("--resync-period", "60s"); err != nil {
			t.Fatal(err)
		}
		w.policies["x/deny"] = netpol("x", "deny", sel("pod", "a"))
		w.policies["x/allow-b"] = withIngress(netpol("x", "allow-b", sel("pod", "b")), from(peers(podPeer(selp("pod", "a")))))
		w.apply(t)
		w.check(t, "before any change")

		ctx := context.Background()
		sh := func(cmd string) {
			t.Helper()
			if out, err := w.sim.Bed.NodeExec(ctx, "sh", "-c", cmd); err != nil {
				t.Fatalf("%s: %v: %s", cmd, err, out)
			}
		}
		ipt := "iptables-" + be.mode
		type change struct{ name, cmd string }
		var changes []change
		switch {
		case !be.iptables():
			changes = []change{
				{"nft flush ruleset", "nft flush ruleset"},
				{"policy table deleted", "nft delete table inet netwarden"},
				{"guard chain flushed", "nft flush chain inet netwarden-guard prerouting"},
				{"guard table deleted", "nft delete table inet netwarden-guard"},
				{"policy chain rule added", "nft insert rule inet netwarden forward-ingress accept"},
			}
		default:
			changes = []change{
				{"mangle FORWARD flushed", ipt + " -t mangle -F FORWARD"},
				{"an accept inserted ahead of our jump", ipt + " -t mangle -I FORWARD 1 -j ACCEPT && " + ipt + " -t mangle -I INPUT 1 -j ACCEPT"},
				{"guard chain flushed", ipt + " -t mangle -F NETWARDEN-GUARD"},
				{"guard chains deleted", ipt + " -t mangle -D PREROUTING -j NETWARDEN-GUARD && " + ipt + " -t mangle -D FORWARD -j NETWARDEN-GUARD-FWD && " +
					ipt + " -t mangle -F NETWARDEN-GUARD && " + ipt + " -t mangle -X NETWARDEN-GUARD && " +
					ipt + " -t mangle -F NETWARDEN-GUARD-FWD && " + ipt + " -t mangle -X NETWARDEN-GUARD-FWD"},
				{"an accept in filter FORWARD first, as kube-proxy puts KUBE-FORWARD", ipt + " -t filter -I FORWARD 1 -j ACCEPT"},
			}
			if be.mode == "nft" {
				changes = append(changes, change{"nft flush ruleset", "nft flush ruleset"})
			}
		}
		for _, c := range changes {
			repairs := policyRepairs(t, w)
			start := time.Now()
			sh(c.cmd)
			if strings.Contains(c.name, "filter FORWARD") {
				// Not ours to repair: the filter table's accept ends only the filter table, and
				// our chains in mangle judged the packet before it.
				w.check(t, c.name)
				continue
			}
			if err := w.sim.WaitStatus(bound, "a repair after: "+c.name, func(st statusapi.Status) bool {
				return st.NetworkPolicy != nil && st.NetworkPolicy.Repairs > repairs
			}); err != nil {
				t.Fatalf("%v\nagent log:\n%s", err, tail(w.sim.Log(), 30))
			}
			t.Logf("%s: repaired %s after the change", c.name, time.Since(start).Round(time.Millisecond))
			if strings.HasPrefix(c.name, "guard") {
				// The guard's drops show in no verdict of a healthy world: look at its rules.
				guardRules := "nft list chain inet netwarden-guard prerouting"
				if be.iptables() {
					guardRules = ipt + " -t mangle -S NETWARDEN-GUARD && " + ipt + " -t mangle -C PREROUTING -j NETWARDEN-GUARD"
				}
				sh(guardRules)
			}
			w.check(t, "after "+c.name)
		}
		if !strings.Contains(w.sim.Log(), "another process changed our") {
			t.Fatalf("the agent did not log the changes it was notified of:\n%s", tail(w.sim.Log(), 30))
		}
	})
}

// TestKubeProxyIPVSRefused: kube-proxy's IPVS mode (its kube-ipvs0 interface) delivers Service
// traffic past the hooks policy is judged in. The agent refuses to enforce there, loudly: the
// sync fails with the reason (status and log), the metric says why, the rules already in the
// kernel stay, and once the interface is gone the next retry applies the pending change.
func TestKubeProxyIPVSRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{nftablesBackend}, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", map[string]string{"ns": "x"})
		w.addPod(t, "x", "a", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		w.addPod(t, "x", "b", map[string]string{"pod": "b"}, cport("web", 80, tcp))
		if err := w.sim.StartAgent(); err != nil {
			t.Fatal(err)
		}
		w.policies["x/deny"] = netpol("x", "deny", sel("pod", "a"))
		w.apply(t)
		w.check(t, "before IPVS")

		ctx := context.Background()
		if out, err := w.sim.Bed.NodeExec(ctx, "ip", "link", "add", "kube-ipvs0", "type", "dummy"); err != nil {
			// Not every kernel has the dummy driver; kube-proxy's check is by name only.
			if out2, err2 := w.sim.Bed.NodeExec(ctx, "ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kube-ipvs0p"); err2 != nil {
				t.Fatalf("creating kube-ipvs0: %v %s; %v %s", err, out, err2, out2)
			}
		}
		// A change while IPVS is there is refused, and says why.
		delete(w.policies, "x/deny")
		data, err := marshalWorld(w)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WriteFile("cluster.yaml", []byte(data)); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitStatus(15*time.Second, "the IPVS refusal", func(st statusapi.Status) bool {
			return st.NetworkPolicy != nil && strings.Contains(st.NetworkPolicy.LastError, "IPVS")
		}); err != nil {
			t.Fatal(err)
		}
		if v := metricValue(metricsOf(t, w.sim.StatusSocket()), `netwarden_enforcement_refused{reason="kube-proxy-ipvs"}`); v != 1 {
			t.Fatalf("netwarden_enforcement_refused{reason=kube-proxy-ipvs} = %v, want 1", v)
		}
		// The last applied rules stay: x/a is still isolated.
		if tcpProbe(w, "x/b", "x/a", 80) {
			t.Fatal("the refusal removed the rules in force")
		}
		if _, err := w.sim.Bed.NodeExec(ctx, "ip", "link", "del", "kube-ipvs0"); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if v := metricValue(metricsOf(t, w.sim.StatusSocket()), `netwarden_enforcement_refused{reason="kube-proxy-ipvs"}`); v != 0 {
			t.Fatalf("netwarden_enforcement_refused{reason=kube-proxy-ipvs} = %v after the interface went, want 0", v)
		}
		w.check(t, "after IPVS is gone")
	})
}
