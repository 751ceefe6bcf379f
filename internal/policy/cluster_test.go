package policy

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

func tierState() *cluster.State {
	st := cluster.NewState()
	for name, team := range map[string]string{"a": "x", "b": "y"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": team}}}
		cluster.DefaultNamespace(ns)
		st.Namespaces[name] = ns
	}
	pod := func(ns, name, node, app, ip string) {
		st.Pods.Set(cluster.Key(ns, name), cluster.PodOf(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
		}))
	}
	pod("a", "p1", "n1", "web", "10.0.0.1")
	pod("a", "p2", "n2", "web", "10.0.1.1")
	pod("b", "p3", "n1", "db", "10.0.0.3")
	st.Nodes["n2"] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"role": "worker"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.2"}, {Type: corev1.NodeHostName, Address: "n2"}}}}
	tcp := func(port int32) []npav1beta1.ClusterNetworkPolicyProtocol {
		return []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: port}}}}
	}
	nsSel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	add := func(name string, tier npav1beta1.Tier, prio int32, subject npav1beta1.ClusterNetworkPolicySubject,
		in []npav1beta1.ClusterNetworkPolicyIngressRule, out []npav1beta1.ClusterNetworkPolicyEgressRule) {
		st.ClusterPolicies[name] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject, Ingress: in, Egress: out}}
	}
	teamX := npav1beta1.ClusterNetworkPolicySubject{Namespaces: nsSel("team", "x")}
	add("deny-y", npav1beta1.AdminTier, 10, teamX, []npav1beta1.ClusterNetworkPolicyIngressRule{{
		Name: "no-y", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
		From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: nsSel("team", "y")}}, Protocols: tcp(80)}}, nil)
	add("pass-db", npav1beta1.AdminTier, 5, teamX, []npav1beta1.ClusterNetworkPolicyIngressRule{{
		Name: "db-to-np", Action: npav1beta1.ClusterNetworkPolicyRuleActionPass,
		From:      []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &npav1beta1.NamespacedPod{NamespaceSelector: *nsSel("team", "y"), PodSelector: *nsSel("app", "db")}}},
		Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}}}, nil)
	add("accept-all", npav1beta1.AdminTier, 20, teamX, []npav1beta1.ClusterNetworkPolicyIngressRule{{
		Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}}}, nil)
	add("unknown-peer", npav1beta1.AdminTier, 1, teamX, []npav1beta1.ClusterNetworkPolicyIngressRule{{
		Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{}}}}, nil)
	add("no-docs", npav1beta1.BaselineTier, 1, npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}, nil,
		[]npav1beta1.ClusterNetworkPolicyEgressRule{
			{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"198.51.100.0/24"}}}},
			{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: nsSel("role", "worker")}}, Protocols: tcp(22)},
		})
	return st
}

func TestClusterPolicyTiers(t *testing.T) {
	st := tierState()
	rs, stats := Compile(st, "n1")
	if stats.ClusterPoliciesSelecting != 5 {
		t.Errorf("ClusterPoliciesSelecting = %d, want 5", stats.ClusterPoliciesSelecting)
	}
	p1, p2, p3 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.0.3")
	docs, node2 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("192.0.2.2")
	// The admin group of a/p1 lists its policies by priority, then name.
	grp := rs.Admin.Groups[rs.Admin.Dispatch[Ingress][p1]]
	want := []string{"admin-in/unknown-peer", "admin-in/pass-db", "admin-in/deny-y", "admin-in/accept-all"}
	if len(grp.Policies) != len(want) {
		t.Fatalf("admin group of a/p1: %v, want %v", grp.Policies, want)
	}
	for i := range want {
		if grp.Policies[i] != want[i] {
			t.Fatalf("admin group of a/p1: %v, want %v", grp.Policies, want)
		}
	}
	if n := len(rs.ClusterPolicies["admin-in/unknown-peer"].Rules); n != 0 {
		t.Errorf("an Accept rule whose only peer has no known field must match nothing; it has %d rules", n)
	}
	for _, c := range []struct {
		name        string
		dir         Direction
		local, peer netip.Addr
		port        uint16
		allowed     bool
		admin       Action
		policy      string
	}{
		{"denied by admin", Ingress, p1, p3, 80, false, Deny, "deny-y"},
		{"named port passes to NetworkPolicy, none isolates, baseline has no ingress", Ingress, p1, p3, 8080, true, Pass, "pass-db"},
		{"accepted by the lowest-priority admin policy", Ingress, p1, p2, 80, true, Accept, "accept-all"},
		{"baseline denies the documentation range", Egress, p1, docs, 443, false, "", "no-docs"},
		{"baseline denies ssh to worker nodes", Egress, p3, node2, 22, false, "", "no-docs"},
		{"baseline lets other node ports through", Egress, p3, node2, 23, true, "", ""},
	} {
		j := rs.Judge(c.dir, c.local, c.peer, TCP, c.port)
		if j.Allowed != c.allowed {
			t.Errorf("%s: allowed = %v, want %v (%+v)", c.name, j.Allowed, c.allowed, j)
		}
		if c.admin != "" && (j.Admin == nil || j.Admin.Action != c.admin || j.Admin.Policy != c.policy) {
			t.Errorf("%s: admin judgement %+v, want %s by %q", c.name, j.Admin, c.admin, c.policy)
		}
		if c.admin == "" && c.policy != "" && (j.Baseline == nil || j.Baseline.Policy != c.policy) {
			t.Errorf("%s: baseline judgement %+v, want %q", c.name, j.Baseline, c.policy)
		}
	}

	// A NetworkPolicy isolating a/p1's egress and admitting everything skips the baseline tier.
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "all-out"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{}}}}
	st.Policies["a/all-out"] = np
	rs, _ = Compile(st, "n1")
	if j := rs.Judge(Egress, p1, docs, TCP, 443); !j.Allowed || j.Baseline != nil || !j.Isolated {
		t.Errorf("NetworkPolicy must decide before the baseline tier: %+v", j)
	}

	// Incremental: a priority change reorders the group; the compile of the changed snapshot
	// equals a fresh compile.
	cc := NewCompiler("n1")
	cc.Compile(st)
	next := st.Clone()
	moved := next.ClusterPolicies["accept-all"].DeepCopy()
	moved.Spec.Priority = 0
	next.ClusterPolicies["accept-all"] = moved
	inc, _ := cc.Compile(next)
	fresh, _ := Compile(next, "n1")
	if j := inc.Judge(Ingress, p1, p3, TCP, 80); !j.Allowed || j.Admin.Policy != "accept-all" {
		t.Errorf("after the priority change accept-all must come first: %+v", j.Admin)
	}
	if g1, g2 := inc.Admin.Groups[inc.Admin.Dispatch[Ingress][p1]], fresh.Admin.Groups[fresh.Admin.Dispatch[Ingress][p1]]; len(g1.Policies) != len(g2.Policies) || g1.Policies[0] != g2.Policies[0] {
		t.Errorf("incremental %v differs from fresh %v", g1.Policies, g2.Policies)
	}
}
