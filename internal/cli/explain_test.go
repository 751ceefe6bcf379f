package cli

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/source/manifests"
)

// exampleManifests copies the demo's cluster and policies into a directory of the test's.
func exampleManifests(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"cluster.yaml", "policies.yaml"} {
		data, err := os.ReadFile(filepath.Join("../../examples/manifests", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// exampleState is the demo's cluster and policies, with the pods running on two nodes.
func exampleState(t *testing.T) *cluster.State {
	t.Helper()
	dir := exampleManifests(t)
	st, errs := manifests.Load(dir, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	ips := map[string][]string{
		"frontend/web":          {"10.244.0.2", "fd00::2"},
		"backend/api":           {"10.244.0.3", "fd00::3"},
		"backend/db":            {"10.244.1.4", "fd00:1::4"},
		"monitoring/prometheus": {"10.244.1.5"},
	}
	for key, p := range st.Pods.All() {
		c := *p
		c.NodeName = "node-a"
		if strings.HasSuffix(ips[key][0], ".4") || strings.HasSuffix(ips[key][0], ".5") {
			c.NodeName = "node-b"
		}
		c.Phase = corev1.PodRunning
		c.IPs = slices.Clone(p.IPs)
		for _, ip := range ips[key] {
			c.IPs = append(c.IPs, netip.MustParseAddr(ip))
		}
		st.Pods.Set(key, &c)
	}
	return st
}

func TestExplain(t *testing.T) {
	st := exampleState(t)
	for _, tc := range []struct {
		from, to, port string
		want           []string
	}{
		{"frontend/web", "backend/db", "80/tcp", []string{
			"frontend/web (10.244.0.2) -> backend/db (10.244.1.4) TCP/80:",
			"  egress:  denied by default isolation of frontend/web (selected by frontend/web-egress; no rule admits backend/db on TCP/80)",
			"  ingress: denied by default isolation of backend/db (selected by backend/db-from-api, backend/default-deny, backend/metrics-from-monitoring; no rule admits frontend/web on TCP/80)",
			"  verdict: denied",
			"frontend/web (fd00::2) -> backend/db (fd00:1::4) TCP/80:",
		}},
		{"backend/api", "backend/db", "80/tcp", []string{
			"  egress:  allowed (no policy selects backend/api for egress)",
			"  ingress: allowed by backend/db-from-api (its ingress rule 1 admits backend/api on TCP/80)",
			"  verdict: allowed",
		}},
		{"monitoring/prometheus", "backend/api", "81/tcp", []string{
			"monitoring/prometheus (10.244.1.5) -> backend/api (10.244.0.3) TCP/81:",
			"  ingress: allowed by backend/metrics-from-monitoring (its ingress rule 1 admits monitoring/prometheus on TCP/81)",
			"  verdict: allowed",
		}},
		{"monitoring/prometheus", "backend/api", "80/tcp", []string{"  verdict: denied"}},
		{"198.51.100.7", "10.244.0.3", "80/udp", []string{
			"198.51.100.7 (198.51.100.7) -> backend/api (10.244.0.3) UDP/80:",
			"  egress:  allowed (198.51.100.7 is no pod: NetworkPolicy does not judge its egress)",
			"  ingress: denied by default isolation of backend/api (selected by backend/api-from-frontend, backend/default-deny, backend/metrics-from-monitoring; no rule admits 198.51.100.7 on UDP/80)",
		}},
	} {
		src, err := resolveEndpoint(st, "--from", tc.from)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := resolveEndpoint(st, "--to", tc.to)
		if err != nil {
			t.Fatal(err)
		}
		proto, port, err := parsePortProto(tc.port)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := explain(&out, st, src, dst, proto, port); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w+"\n") {
				t.Errorf("%s -> %s %s: output lacks %q:\n%s", tc.from, tc.to, tc.port, w, out.String())
			}
		}
	}
}

func TestExplainBadInput(t *testing.T) {
	st := exampleState(t)
	for _, port := range []string{"0/tcp", "80/icmp", "http/tcp", "70000"} {
		if _, _, err := parsePortProto(port); err == nil || !strings.Contains(err.Error(), "--port") {
			t.Errorf("--port %s: %v", port, err)
		}
	}
	if p, n, err := parsePortProto("53/UDP"); err != nil || p != policy.UDP || n != 53 {
		t.Errorf("53/UDP: %v %v %v", p, n, err)
	}
	if _, err := resolveEndpoint(st, "--from", "backend/nope"); err == nil || !strings.Contains(err.Error(), `--from "backend/nope": no such pod`) {
		t.Errorf("unknown pod: %v", err)
	}
	src, _ := resolveEndpoint(st, "--from", "monitoring/prometheus")
	dst, _ := resolveEndpoint(st, "--to", "fd00::3")
	if err := explain(&bytes.Buffer{}, st, src, dst, policy.TCP, 80); err == nil || !strings.Contains(err.Error(), "no address family in common") {
		t.Errorf("no common family: %v", err)
	}
}

// TestExplainTiers names the deciding ClusterNetworkPolicy rule of each tier, and the stages a
// Pass or a missing match leads on to.
func TestExplainTiers(t *testing.T) {
	st := exampleState(t)
	all := &metav1.LabelSelector{}
	backend := &metav1.LabelSelector{MatchLabels: map[string]string{cluster.NamespaceNameLabel: "backend"}}
	st.ClusterPolicies["guard"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 5,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: backend},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{
				{Name: "monitoring-to-np", Action: npav1beta1.ClusterNetworkPolicyRuleActionPass,
					From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{cluster.NamespaceNameLabel: "monitoring"}}}}},
				{Name: "no-frontend-ssh", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
					From:      []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: 22}}}}},
				{Name: "frontend-in", Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
					From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{cluster.NamespaceNameLabel: "frontend"}}}}},
			}}}
	st.ClusterPolicies["no-docs"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "no-docs"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.BaselineTier, Priority: 1,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: all},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"198.51.100.0/24"}}}}}}}
	for _, tc := range []struct {
		from, to, port string
		want           []string
	}{
		{"frontend/web", "backend/db", "80/tcp", []string{
			`  ingress: allowed by ClusterNetworkPolicy guard (admin tier, its ingress rule 3 "frontend-in" accepts)`,
		}},
		{"frontend/web", "backend/db", "22/tcp", []string{
			`  ingress: denied by ClusterNetworkPolicy guard (admin tier, its ingress rule 2 "no-frontend-ssh" denies)`,
			"  verdict: denied",
		}},
		{"monitoring/prometheus", "backend/api", "81/tcp", []string{
			`  ingress: admin tier: passed by ClusterNetworkPolicy guard (its ingress rule 1 "monitoring-to-np"); allowed by backend/metrics-from-monitoring (its ingress rule 1 admits monitoring/prometheus on TCP/81)`,
		}},
		{"backend/api", "198.51.100.7", "443/tcp", []string{
			`  egress:  denied (no NetworkPolicy selects backend/api for egress; denied by ClusterNetworkPolicy no-docs (baseline tier, its egress rule 1 denies))`,
		}},
	} {
		src, err := resolveEndpoint(st, "--from", tc.from)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := resolveEndpoint(st, "--to", tc.to)
		if err != nil {
			t.Fatal(err)
		}
		proto, port, err := parsePortProto(tc.port)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := explain(&out, st, src, dst, proto, port); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w+"\n") {
				t.Errorf("%s -> %s %s: output lacks %q:\n%s", tc.from, tc.to, tc.port, w, out.String())
			}
		}
	}
}
