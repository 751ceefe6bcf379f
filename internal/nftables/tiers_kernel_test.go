package nftables

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
)

// withClusterPolicies adds ClusterNetworkPolicies of both tiers, with every action and kind of
// peer and port, to a state from stateWithPods.
func withClusterPolicies(n int, adminPriority int32) *policy.Ruleset {
	rs, _ := policy.Compile(clusterPolicyState(n, adminPriority), "n1")
	return rs
}

func clusterPolicyState(n int, adminPriority int32) *cluster.State {
	st := stateWithPods(n)
	st.Nodes["n2"] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.2"}, {Type: corev1.NodeInternalIP, Address: "2001:db8::2"}}}}
	all := &metav1.LabelSelector{}
	st.ClusterPolicies["guard"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: adminPriority,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: all},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionPass, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &npav1beta1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1beta1.Port{Range: &npav1beta1.PortRange{Start: 5000, End: 6000}}}}}},
			},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: all}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"198.51.100.0/24", "2001:db8:1::/48"}}}},
			}}}
	st.ClusterPolicies["default-deny"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default-deny"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.BaselineTier, Priority: 1,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{PodSelector: *all}},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionPass, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{SCTP: &npav1beta1.ClusterNetworkPolicyProtocolSCTP{}}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{}}},
			}}}
	return st
}

// TestKernelSkippedPolicyKeepsClusterPolicySets: a NetworkPolicy this backend cannot express
// is skipped, and the sets that only the ClusterNetworkPolicies name stay: their chains
// reference them, and without them the whole transaction failed, so one policy failed the
// node's sync. (Valid objects give chain names nft parses; the policy is renamed in the
// compiled Ruleset to one it does not, the one thing this backend's check rejects.)
func TestKernelSkippedPolicyKeepsClusterPolicySets(t *testing.T) {
	st := clusterPolicyState(2, 10)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	cluster.DefaultNetworkPolicy(np)
	st.Policies["a/web"] = np
	compiled, _ := policy.Compile(st, "n1")
	rs := *compiled
	rs.Policies = map[string]*policy.PolicyRules{}
	for chain, pr := range compiled.Policies {
		rs.Policies[strings.Replace(chain, "/web", "/web policy", 1)] = pr
	}
	if len(rs.AddrSets)+len(rs.NamedPortSets) == 0 {
		t.Fatal("the ClusterNetworkPolicies name no set: the test proves nothing")
	}
	inFreshNetNS(t, func() {
		ctx := context.Background()
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.FullSync(ctx, &rs)
		if err != nil {
			t.Fatalf("full sync with a policy skipped: %v", err)
		}
		if len(res.Skipped) != 1 || res.Skipped[0].Policy != "a/web" {
			t.Fatalf("skipped %+v, want a/web", res.Skipped)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify: %v", err)
		}
	})
}

// TestKernelClusterPolicyTiers loads both tiers, then changes them over netlink and checks that
// the result is exactly what a full sync through nft writes.
func TestKernelClusterPolicyTiers(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		rs := withClusterPolicies(2, 10)
		if _, err := b.FullSync(ctx, rs); err != nil {
			t.Fatalf("full sync: %v", err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify: %v", err)
		}
		out, _ := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
		for _, want := range []string{"goto admin-pass-in-v4", "tier-admin-in-v4", "tier-baseline-in-v6", "chain admin-out/guard-v6", "chain baseline-in/default-deny-v4"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("table lacks %q:\n%s", want, out)
			}
		}
		// A third pod and a new priority: element adds and chain rewrites, over netlink.
		rs2 := withClusterPolicies(3, 11)
		if res, err := b.Sync(ctx, rs2); err != nil || res.Full {
			t.Fatalf("netlink sync: %+v %v (a full sync means the netlink batch failed)", res, err)
		}
		viaNetlink, viaNetlinkExprs := listCanonical(t), ruleExprs(t)
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after netlink sync: %v", err)
		}
		if _, err := b.FullSync(ctx, rs2); err != nil {
			t.Fatal(err)
		}
		if viaCLI := listCanonical(t); viaNetlink != viaCLI {
			t.Fatalf("tables differ.\nnetlink:\n%s\nnft:\n%s", viaNetlink, viaCLI)
		}
		if viaCLIExprs := ruleExprs(t); viaNetlinkExprs != viaCLIExprs {
			t.Fatalf("rule expressions differ.\nnetlink:\n%s\nnft:\n%s", viaNetlinkExprs, viaCLIExprs)
		}
		if err := b.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
