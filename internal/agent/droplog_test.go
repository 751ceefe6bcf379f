package agent

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/nflog"
	"github.com/netwarden/netwarden/internal/policy"
)

type staticSource struct{ st *cluster.State }

func (s staticSource) Run(ctx context.Context, _ func()) error { <-ctx.Done(); return nil }
func (s staticSource) HasSynced() bool                         { return true }
func (s staticSource) Snapshot() *cluster.State                { return s.st }

func pod(ns, name, ip string, phase corev1.PodPhase) *cluster.Pod {
	return cluster.PodOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: corev1.PodStatus{Phase: phase, PodIPs: []corev1.PodIP{{IP: ip}}}})
}

// TestDropLogLines checks what a logged packet becomes: a line naming both pods and the
// reason, once per attempt however often it is retried, and a line for each other attempt.
func TestDropLogLines(t *testing.T) {
	st := cluster.NewState()
	st.Pods.Set("x/server", pod("x", "server", "10.0.0.2", corev1.PodRunning))
	st.Pods.Set("x/client", pod("x", "client", "10.0.0.3", corev1.PodRunning))
	st.Pods.Set("x/old", pod("x", "old", "10.0.0.3", corev1.PodSucceeded)) // its IP went to client
	var buf bytes.Buffer
	a := New(Config{NodeName: "n1", Source: staticSource{st}, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	a.metrics.registerDropLog(true)
	rs := policy.NewRuleset()
	rs.Groups["grp-ingress-1"] = policy.Group{Direction: policy.Ingress, Policies: []string{"in/x/b", "in/x/a"}}
	rs.Policies["in/x/a"] = &policy.PolicyRules{Direction: policy.Ingress, Source: "x/a"}
	rs.Policies["in/x/b"] = &policy.PolicyRules{Direction: policy.Ingress, Source: "x/b"}
	rs.ClusterPolicies["admin-out/fence"] = &policy.ClusterPolicyRules{Tier: policy.AdminTier, Direction: policy.Egress, Source: "fence",
		Rules: []policy.ClusterRule{{Name: "", Index: 2, Action: policy.Deny}}}
	a.applied.Store(rs)
	d := &dropLog{a: a, seen: map[flowKey]time.Time{}}

	syn := nflog.Packet{Prefix: policy.GroupDropID("grp-ingress-1"), Src: netip.MustParseAddr("10.0.0.3"), Dst: netip.MustParseAddr("10.0.0.2"),
		Proto: 6, SrcPort: 40000, DstPort: 80}
	now := time.Now()
	d.handle(syn, now)
	d.handle(syn, now.Add(time.Second)) // the SYN sent again
	other := syn
	other.SrcPort = 40001
	d.handle(other, now.Add(2*time.Second))
	d.handle(nflog.Packet{Prefix: "someone else's"}, now)
	cnp := nflog.Packet{Prefix: policy.ClusterRuleDropID("admin-out/fence", 2), Src: netip.MustParseAddr("10.0.0.3"),
		Dst: netip.MustParseAddr("192.0.2.1"), Proto: 17, SrcPort: 5000, DstPort: 53}
	d.handle(cnp, now)

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (two attempts, one ClusterNetworkPolicy drop):\n%s", len(lines), buf.String())
	}
	for _, want := range []string{"direction=ingress", "src=x/client", "dst=x/server", "proto=tcp", "port=80",
		`reason="isolated by x/a, x/b; no rule admits"`, "policies=x/a,x/b"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line lacks %s: %s", want, lines[0])
		}
	}
	if !strings.Contains(lines[1], "srcIP=10.0.0.3") {
		t.Errorf("second attempt: %s", lines[1])
	}
	for _, want := range []string{"direction=egress", "src=x/client", "dst=-", "proto=udp", "port=53", "clusterPolicy=fence", "rule=#2"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("line lacks %s: %s", want, lines[2])
		}
	}
}
