package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestThirdPartyRulesSurvive: another component keeps its own chain, rules in FORWARD and
// INPUT, and an ipset. Our syncs, incremental and full (after a drift repair), never remove
// them, and a third-party drop placed after our jump still judges packets our policies allow.
func TestThirdPartyRulesSurvive(t *testing.T) {
	t.Parallel()
	forEachBackend(t, iptablesBackends, func(t *testing.T, be backend) {
		ctx := context.Background()
		w := standardWorld(t, be, testbed.Routed, true, true)
		w.apply(t)
		src, dst := w.tpods["y/b"], w.tpods["x/a"]
		ipt := func(bin string, args ...string) {
			t.Helper()
			if out, err := w.sim.Bed.NodeExec(ctx, bin, args...); err != nil {
				t.Fatalf("%s %v: %v %s", bin, args, err, out)
			}
		}
		for _, fam := range []struct{ bin, src, dst string }{
			{"iptables-" + be.mode, src.IPv4.String(), dst.IPv4.String()},
			{"ip6tables-" + be.mode, src.IPv6.String(), dst.IPv6.String()},
		} {
			// In the table that holds ours, where a careless sync could hurt them.
			ipt(fam.bin, "-t", "mangle", "-N", "OTHER-AGENT")
			ipt(fam.bin, "-t", "mangle", "-A", "OTHER-AGENT", "-s", fam.src, "-d", fam.dst, "-p", "tcp", "--dport", "81", "-j", "DROP")
			ipt(fam.bin, "-t", "mangle", "-A", "FORWARD", "-j", "OTHER-AGENT")
			ipt(fam.bin, "-t", "mangle", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
		}
		ipt("ipset", "create", "other-agent", "hash:ip")
		ipt("ipset", "add", "other-agent", "192.0.2.1")

		requireThirdParty := func(step string) {
			t.Helper()
			for _, bin := range []string{"iptables-" + be.mode + "-save", "ip6tables-" + be.mode + "-save"} {
				out, err := w.sim.Bed.NodeExec(ctx, bin, "-t", "mangle")
				if err != nil {
					t.Fatal(err)
				}
				for _, want := range []string{":OTHER-AGENT", "-A FORWARD -j OTHER-AGENT", "-A INPUT -p udp -m udp --dport 9 -j DROP", "--dport 81 -j DROP"} {
					if !strings.Contains(string(out), want) {
						t.Fatalf("%s: %s lost the third party's %q:\n%s", step, bin, want, out)
					}
				}
			}
			if out, err := w.sim.Bed.NodeExec(ctx, "ipset", "list", "other-agent"); err != nil || !strings.Contains(string(out), "192.0.2.1") {
				t.Fatalf("%s: third-party ipset lost: %v %s", step, err, out)
			}
			for _, ip := range []struct{ dst testbed.Probe }{
				{testbed.Probe{Src: src, Dst: dst.IPv4, Port: 81, Protocol: testbed.TCP}},
				{testbed.Probe{Src: src, Dst: dst.IPv6, Port: 81, Protocol: testbed.TCP}},
			} {
				if w.sim.Bed.Probe(ctx, ip.dst) {
					t.Fatalf("%s: the third party's drop of %s no longer applies", step, ip.dst)
				}
			}
			// The third party's rule is the only thing blocking port 81; port 80 is open.
			// Expected open, so retried like every such check: a loaded CI host can starve one try.
			if !tcpOpen(w, "y/b", "x/a", 80) {
				t.Fatalf("%s: y/b -> x/a:80 blocked", step)
			}
		}
		requireThirdParty("before any policy")
		// Every scenario whose policies leave y/b -> x/a on both ports allowed.
		for _, step := range []struct {
			name     string
			policies []*networkingv1.NetworkPolicy
		}{
			{"policy isolating x/a, allowing y", []*networkingv1.NetworkPolicy{
				withIngress(netpol("x", "from-y", sel("pod", "a")), from(peers(nsPeer(selp("ns", "y")))))}},
			{"policy changed to named and numbered ports", []*networkingv1.NetworkPolicy{
				withIngress(netpol("x", "from-y", sel("pod", "a")), from(peers(nsPeer(selp("ns", "y"))), port(tcp, 81), namedPort(tcp, "web")))}},
			{"egress of y/b isolated too", []*networkingv1.NetworkPolicy{
				withIngress(netpol("x", "from-y", sel("pod", "a")), from(peers(nsPeer(selp("ns", "y"))), port(tcp, 81), namedPort(tcp, "web"))),
				withEgress(netpol("y", "to-x", sel("pod", "b"), egressType), to(peers(nsPeer(selp("ns", "x")))))}},
			{"policies removed", nil},
		} {
			w.policies = map[string]*networkingv1.NetworkPolicy{}
			for _, np := range step.policies {
				w.policies[np.Namespace+"/"+np.Name] = np
			}
			w.apply(t)
			requireThirdParty(step.name)
		}
		// A drift repair is a full sync: it rewrites our chains and moves our jump first,
		// and still leaves everything else alone.
		repairs := policyRepairs(t, w)
		ipt("iptables-"+be.mode, "-t", "mangle", "-D", "FORWARD", "-j", "NETWARDEN-FORWARD")
		waitRepaired(t, w, repairs)
		// Ahead of the third party's jump (the guard's drop-only jump may come first).
		out, _ := w.sim.Bed.NodeExec(ctx, "iptables-"+be.mode+"-save", "-t", "mangle")
		if ours, theirs := strings.Index(string(out), "-A FORWARD -j NETWARDEN-FORWARD\n"), strings.Index(string(out), "-A FORWARD -j OTHER-AGENT\n"); ours < 0 || theirs < 0 || ours > theirs {
			t.Fatalf("the repair did not put our jump ahead of the third party's:\n%s", out)
		}
		requireThirdParty("after a full sync")
		w.requireIncremental(t)
	})
}

// TestRestartConverges stops the agent, changes the cluster while it is down (a policy
// replaced, labels changed, a pod deleted), and starts it again over the sets and chains it
// left: it converges to the state a fresh start produces, with no error. For iptables the
// restart also switches variant, whose earlier rules must not keep judging packets.
func TestRestartConverges(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		ctx := context.Background()
		w := standardWorld(t, be, testbed.Routed, true, true)
		w.policies["x/web"] = withIngress(netpol("x", "web", sel("tier", "web")), from(peers(nsPodPeer(selp("team", "red"), selp("pod", "a"))), namedPort(tcp, "web")))
		w.policies["y/out"] = withEgress(netpol("y", "out", sel("pod", "b"), egressType), to(peers(podPeer(selp("tier", "web")))))
		w.policies["z/cidr"] = withIngress(netpol("z", "cidr", sel()), from(peers(ipPeer(testbed.DefaultPodCIDRv4.String(), hostPrefix(w.tpods["x/a"].IPv4)))))
		w.apply(t)
		w.check(t, "before restart")
		if err := w.sim.StopAgent(); err != nil {
			t.Fatalf("agent exit: %v", err)
		}

		delete(w.policies, "y/out")
		w.policies["y/in"] = withIngress(netpol("y", "in", sel()), from(peers(nsPeer(selp("ns", "z"))), port(udp, 80)))
		w.pods["x/b"].Labels["tier"] = "web"
		w.namespaces["z"].Labels["team"] = "red"
		w.removePod(t, "y/b")
		if err := w.sim.SetState(w.objects()...); err != nil {
			t.Fatal(err)
		}
		if !be.iptables() {
			if err := w.sim.StartAgent("--resync-period", "2s"); err != nil {
				t.Fatal(err)
			}
			if err := w.sim.WaitApplied(15 * time.Second); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(w.sim.Log(), "sync failed") {
				t.Fatalf("restart over existing state failed a sync:\n%s", w.sim.Log())
			}
		} else {
			// The same node, restarted on the other iptables variant.
			other := iptablesNFT
			if be.mode == "nft" {
				other = iptablesLegacy
			}
			a := startAgentIn(t, agentBinary(t, other), w.sim.Bed.NodeNetNSName(), w.sim.NodeName, w.sim.Dir)
			a.waitApplied(t, w.sim.Written())
			a.mu.Lock()
			log := a.log.String()
			a.mu.Unlock()
			if strings.Contains(log, "sync failed") || !strings.Contains(log, "backend="+other.name) {
				t.Fatalf("restart on %s over existing state:\n%s", other.name, log)
			}
		}
		if err := w.sim.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		w.check(t, "after restart")
		if be.iptables() {
			for _, cmd := range []string{"iptables-" + be.mode + "-save", "ip6tables-" + be.mode + "-save"} {
				out, _ := w.sim.Bed.NodeExec(ctx, cmd, "-t", "mangle")
				if strings.Contains(string(out), "NETWARDEN-") {
					t.Fatalf("the variant used before the restart still holds our rules:\n%s", out)
				}
			}
		}
	})
}

// startAgentIn runs an agent binary in a network namespace for node name on the manifests in
// dir, until the test ends.
func startAgentIn(t *testing.T, bin, netns, name, dir string) *nodeAgent {
	t.Helper()
	a := &nodeAgent{nodeName: name, sock: filepath.Join(t.TempDir(), "agent.sock")}
	a.cmd = exec.Command("ip", "netns", "exec", netns, bin, "agent", "--manifests", dir,
		"--node-name", name, "--health-addr", "unix:"+a.sock, "--log-level", "debug", "--resync-period", "2s")
	a.cmd.Stdout, a.cmd.Stderr = a, a
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		_ = a.cmd.Wait()
		if t.Failed() {
			a.mu.Lock()
			t.Logf("agent %s on %s:\n%s", filepath.Base(bin), name, tail(a.log.String(), 40))
			a.mu.Unlock()
		}
	})
	return a
}

// TestEventOrder: the rules depend only on the final cluster state, not on the order events
// arrived in. A policy arrives before its namespace and before the namespace its peers live
// in; a pod's IP is taken by a new pod before the old pod's deletion is seen; then the rules
// must equal, object for object, what a fresh agent programs for the same state.
func TestEventOrder(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		ctx := context.Background()
		w := standardWorld(t, be, testbed.Routed, true, true)

		// Policies in and about namespace v, which does not exist yet.
		w.policies["v/deny"] = netpol("v", "deny", sel())
		w.policies["x/from-v"] = withIngress(netpol("x", "from-v", sel("pod", "a")), from(peers(nsPeer(selp("team", "violet")))))
		w.apply(t)
		w.check(t, "policies before their namespaces")
		w.addNamespace("v", map[string]string{"ns": "v"})
		w.addPod(t, "v", "a", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		w.apply(t)
		w.check(t, "namespace and pod arrived, peer namespace not yet labelled")
		w.namespaces["v"].Labels["team"] = "violet"
		w.apply(t)
		w.check(t, "peer namespace labelled")

		// The IP of y/b goes to a new pod z/new (another namespace and labels) before the
		// deletion of y/b is seen: for one step both objects claim the address.
		tp := w.tpods["y/b"]
		w.pods["z/new"] = simnode.PodObject("z", "new", w.sim.NodeName, map[string]string{"pod": "a", "tier": "web"}, tp.IPs(), cport("web", 80, tcp))
		w.tpods["z/new"] = tp
		w.apply(t)
		delete(w.pods, "y/b")
		delete(w.tpods, "y/b")
		w.apply(t)
		w.check(t, "pod IP reused, old pod's deletion seen last")

		// Out of order: a policy update and a relabel that undo each other's effect arrive
		// in the opposite order from how they were made.
		w.policies["x/from-v"] = withIngress(netpol("x", "from-v", sel("pod", "a")), from(peers(nsPeer(selp("team", "indigo")))))
		w.apply(t)
		w.namespaces["v"].Labels["team"] = "indigo"
		w.apply(t)
		w.check(t, "policy updated, then namespace relabelled")

		incremental := settledKernelState(ctx, t, w.sim, be)
		if err := w.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		if out, err := w.sim.RunAgent(ctx, "cleanup"); err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		state := []string{"agent", "--once", "--health-addr", "", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName}
		if out, err := w.sim.RunAgent(ctx, state...); err != nil {
			t.Fatalf("fresh agent: %v\n%s", err, out)
		}
		if fresh := kernelState(ctx, w.sim.Bed, be); fresh != incremental {
			t.Fatalf("rules after the event sequence differ from a fresh agent's:\n%s", lineDiff(incremental, fresh))
		}
	})
}

// lineDiff lists the lines only in a and only in b.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "- "+l)
		case n < 0:
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestAutoBackend: --backend auto takes nftables where nft works, else iptables-nft, else
// iptables-legacy, and says which; each choice enforces. Hosts without nft or iptables-nft are
// made by running the agent with a PATH that lacks them.
func TestAutoBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := denyWorld(t, nftablesBackend, true)
	bin, err := simnode.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		want    string
		without []string // commands hidden from the agent
	}{
		{"nftables", nil},
		{"iptables-nft", []string{"nft"}},
		{"iptables-legacy", []string{"nft", "iptables-nft", "ip6tables-nft", "iptables-nft-save", "ip6tables-nft-save", "iptables-nft-restore", "ip6tables-nft-restore"}},
	} {
		path := pathWithout(t, tc.without)
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", w.sim.Bed.NodeNetNSName(), "env", "-i", "PATH="+path,
			bin, "agent", "--once", "--backend", "auto", "--health-addr", "", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName).CombinedOutput()
		if err != nil {
			t.Fatalf("auto without %v: %v\n%s", tc.without, err, out)
		}
		if !strings.Contains(string(out), `msg="backend selected" backend=`+tc.want) {
			t.Fatalf("auto without %v: want %s selected:\n%s", tc.without, tc.want, out)
		}
		if tcpProbe(w, "x/b", "x/a", 80) {
			t.Fatalf("auto on %s did not enforce", tc.want)
		}
		if out, err := w.sim.RunAgent(ctx, "cleanup"); err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		if left := ourObjects(ctx, t, w.sim.Bed); len(left) > 0 {
			t.Fatalf("cleanup after %s left:\n%s", tc.want, strings.Join(left, "\n"))
		}
	}
}

// pathWithout returns a PATH directory holding links to every command of the usual PATH
// except the hidden ones.
func pathWithout(t *testing.T, hidden []string) string {
	t.Helper()
	dir := t.TempDir()
	skip := map[string]bool{}
	for _, h := range hidden {
		skip[h] = true
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			dst := filepath.Join(dir, e.Name())
			if skip[e.Name()] {
				continue
			}
			if _, err := os.Lstat(dst); err == nil {
				continue // an earlier PATH entry wins
			}
			if err := os.Symlink(filepath.Join(d, e.Name()), dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}
