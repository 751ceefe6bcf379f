package nftables

import (
	"context"
	"net/netip"
	osexec "os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/policy"
)

// fakeLearned is a learner's table: what a DomainSet holds now.
type fakeLearned struct {
	mu    sync.Mutex
	elems map[string][]policy.LearnedElement
}

func (f *fakeLearned) Learned(set string) []policy.LearnedElement {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.elems[set]
}

// withDomains adds an Admin ClusterNetworkPolicy admitting patterns to a state's compile.
func withDomains(t *testing.T, patterns ...npav1beta1.DomainName) *policy.Ruleset {
	t.Helper()
	st := clusterPolicyState(2, 10)
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

// TestKernelLearnedSets: a DomainSet is created with what the learner holds, over netlink and
// through nft alike, in a full sync and in a change that adds it; the learner's own writes
// change timeouts in place and are never taken for drift.
func TestKernelLearnedSets(t *testing.T) {
	one := withDomains(t, "*.example.com")
	two := withDomains(t, "*.example.com", "api.example.org")
	setA := policy.DomainSetName("*.example.com")
	setB := policy.DomainSetName("api.example.org")
	src := &fakeLearned{elems: map[string][]policy.LearnedElement{
		setA: {{Set: setA, Addr: netip.MustParseAddr("192.0.2.10"), Timeout: time.Hour, Comment: "a.example.com from 10.0.0.53 ttl 60s"},
			{Set: setA, Addr: netip.MustParseAddr("2001:db8::10"), Timeout: time.Hour}},
		setB: {{Set: setB, Addr: netip.MustParseAddr("192.0.2.20"), Timeout: time.Hour}},
	}}
	for _, netlink := range []bool{true, false} {
		name := "netlink"
		if !netlink {
			name = "nft"
		}
		t.Run(name, func(t *testing.T) {
			inFreshNetNS(t, func() {
				ctx := context.Background()
				b, err := New()
				if err != nil {
					t.Fatal(err)
				}
				b.netlink = netlink
				b.SetLearnedSource(src)
				if _, err := b.FullSync(ctx, one); err != nil {
					t.Fatal(err)
				}
				holds := func(set, addr string) bool {
					_, err := execOut("nft", "get", "element", "inet", TableName, set, "{", addr, "}")
					return err == nil
				}
				if !holds(setA+"-v4", "192.0.2.10") || !holds(setA+"-v6", "2001:db8::10") {
					t.Fatalf("the full sync left out learned addresses:\n%s", listing(t))
				}
				if out := listing(t); !strings.Contains(out, `comment "a.example.com from 10.0.0.53 ttl 60s"`) || !strings.Contains(out, "flags timeout") {
					t.Errorf("the learned element lacks its comment or the set its timeout flag:\n%s", out)
				}
				// A change adding a DomainSet brings what the learner holds for it.
				if _, err := b.Sync(ctx, two); err != nil {
					t.Fatal(err)
				}
				if !holds(setB+"-v4", "192.0.2.20") {
					t.Fatalf("the new domain set lacks its learned address:\n%s", listing(t))
				}
				// The learner's writes: a new address and a new timeout for an old one.
				if err := b.Admit([]policy.LearnedElement{{Set: setB, Addr: netip.MustParseAddr("192.0.2.21"), Timeout: 90 * time.Second},
					{Set: setA, Addr: netip.MustParseAddr("192.0.2.10"), Timeout: 30 * time.Second},
					{Set: "dom-absent", Addr: netip.MustParseAddr("192.0.2.22"), Timeout: time.Second}}); err != nil {
					t.Fatal(err)
				}
				if !holds(setB+"-v4", "192.0.2.21") {
					t.Errorf("Admit did not add its address")
				}
				if out, _ := execOut("nft", "get", "element", "inet", TableName, setA+"-v4", "{", "192.0.2.10", "}"); !strings.Contains(out, "timeout 30s") {
					t.Errorf("Admit did not replace the timeout: %s", out)
				}
				if err := b.Verify(ctx); err != nil {
					t.Errorf("the learner's writes were taken for drift: %v", err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Errorf("second check: %v", err)
				}
				// A change removing the DomainSet removes it; Admit then writes nothing there.
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

func listing(t *testing.T) string {
	t.Helper()
	out, _ := execOut("nft", "list", "table", "inet", TableName)
	return out
}

func execOut(name string, args ...string) (string, error) {
	out, err := osexec.Command(name, args...).CombinedOutput()
	return string(out), err
}
