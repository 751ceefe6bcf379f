package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netwarden/netwarden/internal/testbed"
)

// TestIncrementalChanges walks one running agent through the changes a cluster sees every
// day; after each, the probed matrix must equal the oracle's.
func TestIncrementalChanges(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := standardWorld(t, be, testbed.Routed, true, true)
		w.policies["x/web"] = withIngress(netpol("x", "web", sel("tier", "web")), from(peers(nsPodPeer(selp("team", "red"), selp("pod", "a")))))
		w.policies["y/out"] = withEgress(netpol("y", "out", sel("pod", "b"), egressType), to(peers(podPeer(selp("tier", "web")))))
		w.apply(t)
		w.check(t, "initial")

		// A pod label change moves a pod into and out of selections, as target and as peer.
		w.pods["x/b"].Labels["tier"] = "web"
		w.pods["y/a"].Labels["pod"] = "c"
		w.apply(t)
		w.check(t, "pod labels changed")

		// Namespace relabelling changes which peers a namespaceSelector admits.
		w.namespaces["z"].Labels["team"] = "red"
		w.namespaces["y"].Labels["team"] = "green"
		w.apply(t)
		w.check(t, "namespaces relabelled")

		// A policy update replaces its rules.
		w.policies["x/web"] = withIngress(netpol("x", "web", sel("tier", "web")), from(nil, port(tcp, 81), port(udp, 80)))
		w.apply(t)
		w.check(t, "policy updated")

		// A new pod is selected as a target and counted as a peer at once.
		w.addPod(t, "x", "c", map[string]string{"pod": "c", "tier": "web"}, cport("web", 80, tcp))
		w.apply(t)
		w.check(t, "pod added")

		// A deleted pod leaves the sets; its IP may be reused by the next pod.
		w.removePod(t, "y/a")
		w.apply(t)
		w.check(t, "pod deleted")
		w.addPod(t, "z", "reuse", map[string]string{"pod": "b"})
		w.apply(t)
		w.check(t, "pod added, possibly on a reused IP")

		// Finished, host-network and IP-less pods are neither targets nor peers.
		w.pods["x/c"].Status.Phase = corev1.PodSucceeded
		w.apply(t)
		w.check(t, "pod succeeded")
		w.pods["x/c"].Status.Phase = corev1.PodRunning
		w.pods["x/c"].Spec.HostNetwork = true
		w.apply(t)
		w.check(t, "pod on host network")
		w.pods["x/c"].Spec.HostNetwork = false
		ips, ip := w.pods["x/c"].Status.PodIPs, w.pods["x/c"].Status.PodIP
		w.pods["x/c"].Status.PodIPs, w.pods["x/c"].Status.PodIP = nil, ""
		w.apply(t)
		w.check(t, "pod without IPs")
		w.pods["x/c"].Status.PodIPs, w.pods["x/c"].Status.PodIP = ips, ip
		w.apply(t)
		w.check(t, "pod got its IPs")

		delete(w.policies, "y/out")
		w.apply(t)
		w.check(t, "policy deleted")
		w.requireIncremental(t)
	})
}

// tcpProbe checks one flow, for tests that look at a single path.
func tcpProbe(w *world, srcKey, dstKey string, port uint16) bool {
	return w.sim.Bed.Probe(context.Background(), testbed.Probe{
		Src: w.tpods[srcKey], Dst: w.tpods[dstKey].IPv4, Port: port, Protocol: testbed.TCP,
	})
}

// TestRestartDriftAndBadInput covers the agent's robustness: a restart converges with no open
// or broken window, a deleted or edited table is repaired within the resync period, and bad
// manifests leave the last good rules in place.
func TestRestartDriftAndBadInput(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := standardWorld(t, be, testbed.Bridge, true, false)
		w.policies["x/deny"] = netpol("x", "deny", sel("pod", "a"))
		w.policies["x/allow-b"] = withIngress(netpol("x", "allow-b", sel("pod", "b")), from(peers(podPeer(selp("pod", "a")))))
		w.apply(t)
		w.check(t, "before restart")

		// Stop the agent: the rules stay.
		if err := w.sim.StopAgent(); err != nil {
			t.Fatalf("agent exit: %v", err)
		}
		if tcpProbe(w, "y/a", "x/a", 80) {
			t.Fatal("stopping the agent opened traffic")
		}
		// While the agent is down, continuously probe one blocked and one allowed flow across the
		// restart; neither may flip at any moment.
		stop := make(chan struct{})
		flips := make(chan string, 100)
		go func() {
			for {
				select {
				case <-stop:
					close(flips)
					return
				default:
				}
				if tcpProbe(w, "y/a", "x/a", 80) {
					flips <- "blocked flow y/a -> x/a opened"
				}
				// One lost SYN on a busy machine is not a broken flow; two in a row are.
				if !tcpProbe(w, "x/a", "x/b", 80) && !tcpProbe(w, "x/a", "x/b", 80) {
					flips <- "allowed flow x/a -> x/b broke"
				}
			}
		}()
		before := w.sim.Syncs()
		if err := w.sim.StartAgent("--resync-period", "1s"); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitSyncs(before, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		close(stop)
		for f := range flips {
			t.Errorf("during restart: %s", f)
		}
		w.check(t, "after restart")

		// Someone removes our rules: repaired within the resync period.
		breakRules(t, w)
		waitFor(t, 10*time.Second, "rules repaired after deletion", func() bool { return !tcpProbe(w, "y/a", "x/a", 80) })
		w.check(t, "after rules deletion")

		// Someone empties the rules that allow x/a -> x/b: repaired too.
		breakAllowChain(t, w)
		waitFor(t, 10*time.Second, "chain repaired after flush", func() bool { return tcpProbe(w, "x/a", "x/b", 80) })
		if !strings.Contains(w.sim.Log(), "repairing kernel state") {
			t.Fatal("agent did not log the repair")
		}

		// A broken file is reported with its name and document number; the last good state of
		// that file stays in force.
		good, err := marshalWorld(w)
		if err != nil {
			t.Fatal(err)
		}
		bad := strings.Replace(good, "name: allow-b", "name: allow-b\n  bogusField: 1", 1)
		if err := w.sim.WriteFile("cluster.yaml", []byte(bad)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "error reported", func() bool {
			return strings.Contains(w.sim.Log(), "cluster.yaml") && strings.Contains(w.sim.Log(), "bogusField")
		})
		w.check(t, "after a broken file")

		// An invalid object (port out of range) is rejected the same way.
		w.policies["x/allow-b"] = withIngress(netpol("x", "allow-b", sel("pod", "b")), from(peers(podPeer(selp("pod", "a"))), port(tcp, 70000)))
		data, _ := marshalWorld(w)
		if err := w.sim.WriteFile("cluster.yaml", []byte(data)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "validation error reported", func() bool { return strings.Contains(w.sim.Log(), "70000") })
		w.policies["x/allow-b"] = withIngress(netpol("x", "allow-b", sel("pod", "b")), from(peers(podPeer(selp("pod", "a")))))
		w.check(t, "after an invalid policy")
	})
}

// breakRules removes what the backend installed as another admin might: the nftables table,
// or the jump into our iptables chains.
func breakRules(t *testing.T, w *world) {
	t.Helper()
	ctx := context.Background()
	var out []byte
	var err error
	if w.be.iptables() {
		out, err = w.sim.Bed.NodeExec(ctx, "iptables-"+w.be.mode, "-D", "FORWARD", "-j", "NETWARDEN-FORWARD")
	} else {
		out, err = w.sim.Bed.NodeExec(ctx, "nft", "delete", "table", "inet", "netwarden")
	}
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// breakAllowChain makes the rules of policy x/allow-b allow nothing: the nftables policy chain for
// IPv4 is flushed; in iptables, where a group chain holds its policies' rules, the group chain
// allowing from a pod set is left with only its final drop.
func breakAllowChain(t *testing.T, w *world) {
	t.Helper()
	ctx := context.Background()
	if !w.be.iptables() {
		if out, err := w.sim.Bed.NodeExec(ctx, "nft", "flush", "chain", "inet", "netwarden", "in/x/allow-b-v4"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return
	}
	ipt := "iptables-" + w.be.mode
	out, err := w.sim.Bed.NodeExec(ctx, ipt+"-save", "-t", "filter")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	chain := ""
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" && strings.HasPrefix(f[1], "NETWARDEN-G-") && strings.Contains(l, "--match-set netwarden-p4-") {
			chain = f[1]
		}
	}
	if chain == "" {
		t.Fatalf("no group chain allowing from a pod set:\n%s", out)
	}
	for _, args := range [][]string{{"-F", chain}, {"-A", chain, "-j", "DROP"}} {
		if out, err := w.sim.Bed.NodeExec(ctx, ipt, args...); err != nil {
			t.Fatalf("%s %v: %v: %s", ipt, args, err, out)
		}
	}
}

func marshalWorld(w *world) (string, error) {
	b, err := marshalObjects(w)
	return string(b), err
}

func marshalObjects(w *world) ([]byte, error) {
	objs := w.objects()
	return simnodeMarshal(objs)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for: %s", timeout, what)
}

var _ = networkingv1.PolicyTypeIngress
