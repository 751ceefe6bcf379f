package e2e

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
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

// lastTryTimeout bounds the last try of a probe expected to pass: a loaded machine (the CI
// host runs every package at once) can starve a probe past the bed's timeout. A probe expected
// to fail is never retried, so waiting longer cannot hide an open flow.
const lastTryTimeout = 3 * time.Second

// tcpOpen reports whether a TCP connection from srcKey to dstKey:port succeeds, trying up to
// three times, the last with lastTryTimeout: for checks that expect the flow to be allowed.
func tcpOpen(w *world, srcKey, dstKey string, port uint16) bool {
	p := testbed.Probe{Src: w.tpods[srcKey], Dst: w.tpods[dstKey].IPv4, Port: port, Protocol: testbed.TCP}
	for attempt := range 3 {
		if attempt == 2 {
			p.Timeout = lastTryTimeout
		}
		if w.sim.Bed.Probe(context.Background(), p) {
			return true
		}
	}
	return false
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
		var rounds atomic.Int64
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
				// A lost SYN on a busy machine is not a broken flow; three failed tries are.
				if !tcpOpen(w, "x/a", "x/b", 80) {
					flips <- "allowed flow x/a -> x/b broke"
				}
				rounds.Add(1)
			}
		}()
		if err := w.sim.StartAgent("--resync-period", "1s"); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		// Keep probing for a few more rounds after the first sync, so that a flip it caused
		// shortly after the status turned is seen too.
		rounds.Store(0)
		waitFor(t, 15*time.Second, "five probe rounds after the restart", func() bool { return rounds.Load() >= 5 })
		close(stop)
		for f := range flips {
			t.Errorf("during restart: %s", f)
		}
		w.check(t, "after restart")

		// Someone removes our rules: repaired within the resync period.
		repairs := policyRepairs(t, w)
		breakRules(t, w)
		waitRepaired(t, w, repairs)
		w.check(t, "after rules deletion")

		// Someone empties the rules that allow x/a -> x/b: repaired too.
		repairs = policyRepairs(t, w)
		breakAllowChain(t, w)
		waitRepaired(t, w, repairs)
		w.check(t, "after the chain was flushed")
		if w.sim.WaitLogged(10*time.Second, "repairing kernel state") != "" {
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
		// The status says when the broken content was read (and its last good content kept).
		if err := w.sim.WaitApplied(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		if w.sim.WaitLogged(10*time.Second, "cluster.yaml", "bogusField") != "" {
			t.Fatalf("the broken file was read but its error not reported:\n%s", tail(w.sim.Log(), 20))
		}
		w.check(t, "after a broken file")

		// An invalid object (port out of range) is rejected the same way.
		w.policies["x/allow-b"] = withIngress(netpol("x", "allow-b", sel("pod", "b")), from(peers(podPeer(selp("pod", "a"))), port(tcp, 70000)))
		data, _ := marshalWorld(w)
		if err := w.sim.WriteFile("cluster.yaml", []byte(data)); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		if w.sim.WaitLogged(10*time.Second, "70000") != "" {
			t.Fatalf("the invalid policy was read but not reported:\n%s", tail(w.sim.Log(), 20))
		}
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
		out, err = w.sim.Bed.NodeExec(ctx, "iptables-"+w.be.mode, "-t", "mangle", "-D", "FORWARD", "-j", "NETWARDEN-FORWARD")
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
	out, err := w.sim.Bed.NodeExec(ctx, ipt+"-save", "-t", "mangle")
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
	for _, args := range [][]string{{"-t", "mangle", "-F", chain}, {"-t", "mangle", "-A", chain, "-j", "DROP"}} {
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

// policyRepairs reads how many times the agent has restored NetworkPolicy rules that someone
// else changed.
func policyRepairs(t *testing.T, w *world) uint64 {
	t.Helper()
	st, err := w.sim.Status()
	if err != nil || st.NetworkPolicy == nil {
		t.Fatalf("agent status: %+v, %v", st, err)
	}
	return st.NetworkPolicy.Repairs
}

// waitRepaired waits until the agent reports one more restore of its rules than before.
func waitRepaired(t *testing.T, w *world, before uint64) {
	t.Helper()
	if err := w.sim.WaitStatus(15*time.Second, "a repair", func(st statusapi.Status) bool {
		return st.NetworkPolicy != nil && st.NetworkPolicy.Repairs > before
	}); err != nil {
		t.Fatal(err)
	}
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
