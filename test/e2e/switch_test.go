package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestBackendSwitchRetiresOldRules restarts the agent on another backend, as a host that
// loses or gains nft (with --backend auto) or an operator's change does: once the new backend
// holds the rules, nothing of the old one is left, NetworkPolicy and masquerade alike, and the
// policy is enforced throughout.
func TestBackendSwitchRetiresOldRules(t *testing.T) {
	requireKernel(t)
	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{IPv4: true, IPv6: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	a, ta, err := sim.AddPod("x", "a", map[string]string{"pod": "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, tb, err := sim.AddPod("x", "b", map[string]string{"pod": "b"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.Bed.Config()
	node := nodeObject(sim.NodeName, cfg.PodCIDRv4.String(), cfg.PodCIDRv6.String())
	if err := sim.SetState([]runtime.Object{simnode.Namespace("x", nil), node, a, b, netpol("x", "deny-a", sel("pod", "a"))}...); err != nil {
		t.Fatal(err)
	}
	kernel := func() string {
		out, _ := exec.Command("ip", "netns", "exec", sim.Bed.NodeNetNSName(), "sh", "-c",
			"nft list tables; iptables-nft-save; ip6tables-nft-save; iptables-legacy-save; ip6tables-legacy-save; ipset list -n").CombinedOutput()
		return string(out)
	}
	run := func(backend, mode string) {
		t.Helper()
		t.Setenv("NETWARDEN_IPTABLES_MODE", mode)
		if err := sim.StartAgent("--backend", backend); err != nil {
			t.Fatal(err)
		}
		if err := sim.WaitStatus(20*time.Second, backend+" "+mode+" ready", func(st statusapi.Status) bool {
			return st.Ready && sim.Applied(st)
		}); err != nil {
			t.Fatal(err)
		}
		if sim.Bed.Probe(context.Background(), testbed.Probe{Src: tb, Dst: ta.IP(4), Port: 80, Protocol: testbed.TCP}) {
			t.Errorf("%s %s: b reached a, which deny-a isolates", backend, mode)
		}
		if !sim.Bed.Probe(context.Background(), testbed.Probe{Src: ta, Dst: tb.IP(4), Port: 80, Protocol: testbed.TCP}) {
			t.Errorf("%s %s: a cannot reach b", backend, mode)
		}
		if err := sim.StopAgent(); err != nil {
			t.Fatalf("agent exit: %v", err)
		}
	}
	// What each backend keeps in the kernel, by a name that appears in the listing above.
	nftPolicy, nftMasq := "table inet netwarden\n", "table inet netwarden-masq"
	iptPolicy, iptMasq := ":NETWARDEN-FORWARD", ":NETWARDEN-MASQ"

	run("nftables", "")
	if k := kernel(); !strings.Contains(k, nftPolicy) || !strings.Contains(k, nftMasq) {
		t.Fatalf("nftables run left no tables:\n%s", k)
	}
	run("iptables", "nft")
	k := kernel()
	if strings.Contains(k, nftPolicy) || strings.Contains(k, nftMasq) {
		t.Errorf("after switching to iptables the nftables tables remain:\n%s", k)
	}
	if !strings.Contains(k, iptPolicy) || !strings.Contains(k, iptMasq) {
		t.Errorf("iptables run left no chains:\n%s", k)
	}
	run("iptables", "legacy")
	legacy, _ := exec.Command("ip", "netns", "exec", sim.Bed.NodeNetNSName(), "sh", "-c", "iptables-nft-save; ip6tables-nft-save").CombinedOutput()
	if strings.Contains(string(legacy), "NETWARDEN") {
		t.Errorf("after switching to iptables-legacy, iptables-nft still holds our chains:\n%s", legacy)
	}
	run("nftables", "")
	k = kernel()
	for _, left := range []string{"NETWARDEN", "netwarden-", "nwmasq"} {
		for _, line := range strings.Split(k, "\n") {
			if strings.Contains(line, left) && !strings.HasPrefix(line, "table inet netwarden") {
				t.Errorf("after switching back to nftables, left over: %s", line)
			}
		}
	}
}

func nodeObject(name string, podCIDRs ...string) *corev1.Node {
	return &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.NodeSpec{PodCIDRs: podCIDRs}}
}
