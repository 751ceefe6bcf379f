package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

var modes = []xtables.Mode{xtables.ModeNFT, xtables.ModeLegacy}

// inFreshNetNS runs fn in a new, empty network namespace, so iptables and ipset commands
// never touch the host.
func inFreshNetNS(t *testing.T, fn func()) {
	t.Helper()
	kerneltest.InFreshNetNS(t, fn, "ipset", "iptables-nft-restore", "iptables-legacy-restore", "ip6tables-nft-restore", "ip6tables-legacy-restore")
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func stateWithPods(n int) *cluster.State {
	st := cluster.NewState()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	cluster.DefaultNamespace(ns)
	st.Namespaces["a"] = ns
	for i := 0; i < n; i++ {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: fmt.Sprintf("p%d", i), Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: int32(8000 + i), Protocol: corev1.ProtocolTCP}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.0.0.%d", i+1)}, {IP: fmt.Sprintf("fd00::%d", i+1)}}},
		}
		st.Pods.Set(cluster.Key("a", p.Name), cluster.PodOf(p))
	}
	sctp := corev1.ProtocolSCTP
	end := int32(90)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:1::/64", Except: []string{"fd00:1::/80"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.7/32"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &intstr.IntOrString{IntVal: 80}, EndPort: &end},
					{Port: &intstr.IntOrString{Type: intstr.String, StrVal: "http"}}, {Protocol: &sctp}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{}},
		},
	}
	cluster.DefaultNetworkPolicy(np)
	st.Policies["a/web"] = np
	return st
}

// ours returns our chains (both families, as iptables-save prints them) and our sets (as
// ipset save prints them, members sorted): what the kernel holds of ours.
func ours(t *testing.T, mode xtables.Mode) string {
	t.Helper()
	var lines []string
	for _, cmd := range []string{"iptables-" + string(mode) + "-save", "ip6tables-" + string(mode) + "-save"} {
		for _, l := range strings.Split(run(t, cmd, "-t", Table), "\n") {
			if strings.Contains(l, ChainPrefix) {
				lines = append(lines, cmd+" "+strings.Split(l, " [")[0])
			}
		}
	}
	var sets []string
	for _, l := range strings.Split(run(t, "ipset", "save"), "\n") {
		if strings.Contains(l, SetPrefix) {
			sets = append(sets, createHead(l))
		}
	}
	sort.Strings(sets)
	return strings.Join(append(lines, sets...), "\n")
}

// thirdParty installs rules, a chain and a set another component would own, in the table that
// holds ours.
func thirdParty(t *testing.T, mode xtables.Mode) {
	for _, bin := range []string{"iptables-" + string(mode), "ip6tables-" + string(mode)} {
		run(t, bin, "-t", Table, "-N", "OTHER-AGENT")
		run(t, bin, "-t", Table, "-A", "OTHER-AGENT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT")
		run(t, bin, "-t", Table, "-A", "FORWARD", "-j", "OTHER-AGENT")
		run(t, bin, "-t", Table, "-A", "INPUT", "-p", "udp", "--dport", "9998", "-j", "DROP")
	}
	run(t, "ipset", "create", "other-agent", "hash:ip")
}

func requireThirdParty(t *testing.T, mode xtables.Mode) {
	t.Helper()
	for _, bin := range []string{"iptables-" + string(mode) + "-save", "ip6tables-" + string(mode) + "-save"} {
		out := run(t, bin, "-t", Table)
		for _, want := range []string{"-A OTHER-AGENT -p tcp -m tcp --dport 9999 -j ACCEPT", "-A FORWARD -j OTHER-AGENT", "-A INPUT -p udp -m udp --dport 9998 -j DROP"} {
			if !strings.Contains(out, want) {
				t.Fatalf("%s: third-party rule %q is gone:\n%s", bin, want, out)
			}
		}
	}
	if !strings.Contains(run(t, "ipset", "list", "-n"), "other-agent") {
		t.Fatal("third-party set is gone")
	}
}

func TestKernelSyncVerifyCleanup(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			inFreshNetNS(t, func() {
				ctx := context.Background()
				thirdParty(t, mode)
				b, err := New(ctx, mode)
				if err != nil {
					t.Fatal(err)
				}
				if b.Name() != "iptables-"+string(mode) {
					t.Fatalf("name %q", b.Name())
				}
				rs, _ := policy.Compile(stateWithPods(2), "n1")
				res, err := b.FullSync(ctx, rs)
				if err != nil {
					t.Fatalf("full sync: %v", err)
				}
				if !res.Full || res.Operations == 0 {
					t.Fatalf("full sync result %+v", res)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after full sync: %v\n%s", err, ours(t, mode))
				}
				requireThirdParty(t, mode)
				// Our jumps come first in the built-in chains, ahead of the third party's.
				if out := run(t, "iptables-"+string(mode)+"-save", "-t", Table); !strings.Contains(out, "-A FORWARD -j NETWARDEN-FORWARD\n-A FORWARD -j OTHER-AGENT") {
					t.Fatalf("jump not first:\n%s", out)
				}

				if res, err := b.Sync(ctx, rs); err != nil || res.Operations != 0 {
					t.Fatalf("no-op sync: %+v %v", res, err)
				}
				// One more local pod: set members, and the dispatch chains (each direction and
				// family) rewritten with one more rule.
				rs3, _ := policy.Compile(stateWithPods(3), "n1")
				res, err = b.Sync(ctx, rs3)
				if err != nil || res.Full || res.Operations == 0 || res.Operations > 24 {
					t.Fatalf("incremental sync: %+v %v", res, err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after incremental sync: %v", err)
				}
				// The incremental path leaves exactly what a full sync writes.
				incremental := ours(t, mode)
				fresh, err := New(ctx, mode)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := fresh.FullSync(ctx, rs3); err != nil {
					t.Fatal(err)
				}
				if full := ours(t, mode); full != incremental {
					t.Fatalf("incremental and full sync differ:\nincremental:\n%s\nfull:\n%s", incremental, full)
				}

				// Removing the policy removes its chains and sets.
				empty := stateWithPods(2)
				delete(empty.Policies, "a/web")
				rsEmpty, _ := policy.Compile(empty, "n1")
				if _, err := b.Sync(ctx, rs3); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Sync(ctx, rsEmpty); err != nil {
					t.Fatalf("removing policy: %v", err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after removal: %v", err)
				}
				// iptables-nft defers the removals until compaction; the kernel holds
				// exactly what the backend says meanwhile.
				if pending := b.CompactionPending(); pending != (mode == xtables.ModeNFT) {
					t.Fatalf("compaction pending %v after removing the policy, want %v", pending, mode == xtables.ModeNFT)
				}
				// A sync that changes nothing leaves them to the compaction.
				if res, err := b.Sync(ctx, rsEmpty); err != nil || res.Operations != 0 {
					t.Fatalf("no-op sync with removals deferred: %+v %v", res, err)
				}
				if pending := b.CompactionPending(); pending != (mode == xtables.ModeNFT) {
					t.Fatalf("compaction pending %v after a no-op sync, want %v", pending, mode == xtables.ModeNFT)
				}
				if _, err := b.Compact(ctx); err != nil {
					t.Fatalf("compact: %v", err)
				}
				if b.CompactionPending() {
					t.Fatal("compaction still pending after Compact")
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after compaction: %v", err)
				}
				if got := ours(t, mode); strings.Contains(got, groupPrefix) || strings.Contains(got, "netwarden-p") {
					t.Fatalf("group chain or set left behind:\n%s", got)
				}
				if _, err := b.Sync(ctx, rs); err != nil {
					t.Fatal(err)
				}

				// Restart: a new agent converges from existing chains and sets (and a swap
				// set left by a run that died), with no "already exists" or "in use".
				run(t, "ipset", "create", swapSet, "hash:net")
				restarted, err := New(ctx, mode)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := restarted.FullSync(ctx, rs3); err != nil {
					t.Fatalf("full sync over existing state: %v", err)
				}
				if err := restarted.Verify(ctx); err != nil {
					t.Fatal(err)
				}
				if got := ours(t, mode); got != incremental {
					t.Fatalf("restart did not converge:\n%s\nwant:\n%s", got, incremental)
				}
				b = restarted

				// Someone else's edits are detected and repaired.
				grp := "" // the ingress group, whose first rule matches a set
				for name, rules := range b.applied.Chains[v4] {
					if strings.HasPrefix(name, groupPrefix) && strings.Contains(rules[0], "--match-set") {
						grp = name
					}
				}
				var set string
				for name, s := range b.applied.Sets {
					if strings.HasPrefix(name, SetPrefix+"p4") && s.Count() > 0 {
						set = name
					}
				}
				ipt := "iptables-" + string(mode)
				for _, edit := range [][]string{
					{ipt, "-t", Table, "-F", grp},
					{ipt, "-t", Table, "-R", grp, "1", "-j", "RETURN"},
					{ipt, "-t", Table, "-D", "FORWARD", "-j", chainForward},
					{ipt, "-t", Table, "-I", "FORWARD", "-j", "OTHER-AGENT"},
					{"ip6tables-" + string(mode), "-t", Table, "-A", chainIngress, "-j", "RETURN"},
					{"ipset", "del", set, "10.0.0.1"},
					{"ipset", "add", set, "10.9.9.9"},
				} {
					run(t, edit[0], edit[1:]...)
					if err := b.Verify(ctx); err == nil {
						t.Fatalf("verify did not notice %v", edit)
					}
					if _, err := b.FullSync(ctx, rs3); err != nil {
						t.Fatal(err)
					}
					if err := b.Verify(ctx); err != nil {
						t.Fatalf("verify after repair of %v: %v", edit, err)
					}
				}
				requireThirdParty(t, mode)

				if err := b.Cleanup(ctx); err != nil {
					t.Fatal(err)
				}
				if got := ours(t, mode); got != "" {
					t.Fatalf("left after cleanup:\n%s", got)
				}
				requireThirdParty(t, mode)
				if err := b.Cleanup(ctx); err != nil {
					t.Fatalf("cleanup must be idempotent: %v", err)
				}
			})
		})
	}
}

// TestKernelSwitchVariant: an agent that ran with one iptables variant and restarts with the
// other removes the first one's chains, which would otherwise keep judging packets, and
// reuses the sets.
func TestKernelSwitchVariant(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		rs, _ := policy.Compile(stateWithPods(2), "n1")
		legacy, err := New(ctx, xtables.ModeLegacy)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := legacy.FullSync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		nft, err := New(ctx, xtables.ModeNFT)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nft.FullSync(ctx, rs); err != nil {
			t.Fatalf("full sync over the other variant's state: %v", err)
		}
		if err := nft.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
			for _, table := range []string{Table, oldTable} {
				if out := run(t, cmd, "-t", table); strings.Contains(out, ChainPrefix) {
					t.Fatalf("%s -t %s still holds our rules:\n%s", cmd, table, out)
				}
			}
		}
		if err := nft.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFullSyncRemovesFilterTableLayout: releases before the move to mangle kept the chains and
// jumps in the filter table, where an accept of kube-proxy's could come first. A full sync
// takes them out (leaving the other components' rules), and so does Cleanup.
func TestFullSyncRemovesFilterTableLayout(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			inFreshNetNS(t, func() {
				ctx := context.Background()
				b, err := New(ctx, mode)
				if err != nil {
					t.Fatal(err)
				}
				for _, bin := range []string{"iptables-" + string(mode), "ip6tables-" + string(mode)} {
					run(t, bin, "-t", oldTable, "-N", chainForward)
					run(t, bin, "-t", oldTable, "-N", groupPrefix+"old")
					run(t, bin, "-t", oldTable, "-A", chainForward, "-g", groupPrefix+"old")
					run(t, bin, "-t", oldTable, "-A", groupPrefix+"old", "-j", "DROP")
					run(t, bin, "-t", oldTable, "-I", "FORWARD", "-j", chainForward)
					run(t, bin, "-t", oldTable, "-A", "FORWARD", "-p", "tcp", "--dport", "7", "-j", "ACCEPT")
				}
				rs, _ := policy.Compile(stateWithPods(2), "n1")
				if _, err := b.FullSync(ctx, rs); err != nil {
					t.Fatal(err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatal(err)
				}
				for _, cmd := range []string{"iptables-" + string(mode) + "-save", "ip6tables-" + string(mode) + "-save"} {
					out := run(t, cmd, "-t", oldTable)
					if strings.Contains(out, ChainPrefix) {
						t.Fatalf("%s -t %s still holds the old layout:\n%s", cmd, oldTable, out)
					}
					if !strings.Contains(out, "-A FORWARD -p tcp -m tcp --dport 7 -j ACCEPT") {
						t.Fatalf("%s -t %s lost another component's rule:\n%s", cmd, oldTable, out)
					}
					if out := run(t, cmd, "-t", Table); !strings.Contains(out, "-A FORWARD -j "+chainForward) || !strings.Contains(out, "-A INPUT -j "+chainInput) {
						t.Fatalf("%s -t %s lacks our jumps:\n%s", cmd, Table, out)
					}
				}
				if err := b.Cleanup(ctx); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// createHead cuts an `ipset save` create line after the family: the table size grows with
// use and the hash seed is random, neither is content.
func createHead(line string) string {
	f := strings.Fields(line)
	if len(f) > 5 && f[0] == "create" && f[3] == "family" {
		return strings.Join(f[:5], " ")
	}
	return line
}

// TestKernelManyExcepts: an ipBlock of ::/0 with ten thousand excepts (the API limits neither)
// is more than a million prefixes, more than a set of pods may hold; its set is made as large
// as it needs, and the policy is applied, not skipped.
func TestKernelManyExcepts(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		st := stateWithPods(2)
		var except []string
		for i := range 10000 {
			var b [16]byte
			x := uint64(i+1) * 0x9e3779b97f4a7c15
			for j := range 8 {
				b[j] = byte(x >> (8 * j))
				b[8+j] = byte(x >> (8 * (7 - j)))
			}
			except = append(except, netip.AddrFrom16(b).String()+"/128")
		}
		np := st.Policies["a/web"]
		np.Spec.Ingress[0].From = append(np.Spec.Ingress[0].From, networkingv1.NetworkPolicyPeer{
			IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: except}})
		if errs := cluster.ValidateNetworkPolicy(np); len(errs) > 0 {
			t.Fatalf("the test's policy is invalid: %v", errs)
		}
		rs, _ := policy.Compile(st, "n1")
		var set string
		for name, cs := range rs.CIDRSets {
			if len(cs.Prefixes) > maxSetElements {
				set = cidrSet(name, v6)
			}
		}
		if set == "" {
			t.Fatal("no ipBlock of more than a million prefixes: the test proves nothing")
		}
		b, err := New(ctx, xtables.ModeNFT)
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.FullSync(ctx, rs)
		if err != nil {
			t.Fatalf("full sync: %v", err)
		}
		if len(res.Skipped) != 0 {
			t.Fatalf("skipped %+v", res.Skipped)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		for addr, member := range map[string]bool{except[0][:len(except[0])-4]: false, except[9999][:len(except[9999])-4]: false, "2001:db8::1": true, "fd00::1": true} {
			err := exec.Command("ipset", "test", set, addr).Run()
			if (err == nil) != member {
				t.Errorf("ipset test %s %s: %v, want member=%v", set, addr, err, member)
			}
		}
		if err := b.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
