package iptables

import (
	"context"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/policy"
)

type fakeLearned struct {
	mu    sync.Mutex
	elems map[string][]policy.LearnedElement
}

func (f *fakeLearned) Learned(set string) []policy.LearnedElement {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.elems[set]
}

func withDomains(t *testing.T, patterns ...npav1beta1.DomainName) *policy.Ruleset {
	t.Helper()
	st := stateWithPods(2)
	st.ClusterPolicies["names"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "names"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 3,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
				To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{DomainNames: patterns}}}}}}
	rs, _ := policy.Compile(st, "n1")
	if len(rs.DomainSets) != len(patterns) {
		t.Fatalf("%d domain sets for %d patterns", len(rs.DomainSets), len(patterns))
	}
	return rs
}

// TestKernelLearnedSets: a DomainSet's ipset is created with what the learner holds, in a
// full sync and in a change that adds it; a full sync keeps what an existing one holds; the
// learner's writes replace timeouts and are never taken for drift.
func TestKernelLearnedSets(t *testing.T) {
	one := withDomains(t, "*.example.com")
	two := withDomains(t, "*.example.com", "api.example.org")
	setA, setB := policy.DomainSetName("*.example.com"), policy.DomainSetName("api.example.org")
	src := &fakeLearned{elems: map[string][]policy.LearnedElement{
		setA: {{Set: setA, Addr: netip.MustParseAddr("192.0.2.10"), Timeout: time.Hour, Comment: "a.example.com from 10.0.0.53 ttl 60s"},
			{Set: setA, Addr: netip.MustParseAddr("2001:db8::10"), Timeout: time.Hour}},
		setB: {{Set: setB, Addr: netip.MustParseAddr("192.0.2.20"), Timeout: time.Hour}},
	}}
	holds := func(set string, addr string) bool {
		return exec.Command("ipset", "test", set, addr).Run() == nil
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			inFreshNetNS(t, func() {
				ctx := context.Background()
				b, err := New(ctx, mode)
				if err != nil {
					t.Fatal(err)
				}
				b.SetLearnedSource(src)
				if _, err := b.FullSync(ctx, one); err != nil {
					t.Fatal(err)
				}
				a4, a6, b4 := domainSetName(setA, v4), domainSetName(setA, v6), domainSetName(setB, v4)
				if !holds(a4, "192.0.2.10") || !holds(a6, "2001:db8::10") {
					t.Fatalf("the full sync left out learned addresses:\n%s", run(t, "ipset", "list"))
				}
				if out := run(t, "ipset", "list", a4); !strings.Contains(out, `comment "a.example.com from 10.0.0.53 ttl 60s"`) {
					t.Errorf("the learned member lacks its comment:\n%s", out)
				}
				if _, err := b.Sync(ctx, two); err != nil {
					t.Fatal(err)
				}
				if !holds(b4, "192.0.2.20") {
					t.Fatalf("the new domain set lacks its learned address:\n%s", run(t, "ipset", "list"))
				}
				if err := b.Admit([]policy.LearnedElement{{Set: setB, Addr: netip.MustParseAddr("192.0.2.21"), Timeout: 90 * time.Second},
					{Set: setA, Addr: netip.MustParseAddr("192.0.2.10"), Timeout: 30 * time.Second}}); err != nil {
					t.Fatal(err)
				}
				if !holds(b4, "192.0.2.21") {
					t.Errorf("Admit did not add its address")
				}
				if e, err := Learned(ctx, setA, netip.MustParseAddr("192.0.2.10")); err != nil || !e.Held || secondsLeft(e.Expires) > 30 || secondsLeft(e.Expires) <= 0 {
					t.Errorf("Admit did not replace the timeout: %+v %v", e, err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Errorf("the learner's writes were taken for drift: %v", err)
				}
				// What a restarted learner starts from: each member with its DomainSet.
				read, err := b.ReadLearned()
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, e := range read {
					if e.Set == setB && e.Addr == netip.MustParseAddr("192.0.2.21") && e.Timeout > 0 && e.Timeout <= 90*time.Second {
						found = true
					}
				}
				if !found || len(read) != 4 {
					t.Errorf("ReadLearned: %+v", read)
				}
				// A full sync (a repair, a restart) keeps what the learner wrote, even what its
				// source no longer has.
				if _, err := b.FullSync(ctx, two); err != nil {
					t.Fatal(err)
				}
				if !holds(b4, "192.0.2.21") {
					t.Errorf("a full sync dropped a learned member")
				}
				if _, err := b.Sync(ctx, one); err != nil {
					t.Fatal(err)
				}
				if err := b.Admit([]policy.LearnedElement{{Set: setB, Addr: netip.MustParseAddr("192.0.2.23"), Timeout: time.Second}}); err != nil {
					t.Errorf("Admit to a removed set: %v", err)
				}
			})
		})
	}
}

func secondsLeft(s string) int {
	n, err := strconv.Atoi(strings.TrimSuffix(s, "s"))
	if err != nil {
		return -1
	}
	return n
}
