package iptables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/nflog"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

const stagedLogGroup = 17

// stagedBed is a node with a client and a server pod (IPv4 and IPv6, TCP servers on 80 and
// 81), on which a Backend of one iptables variant runs with staged logging to NFLOG.
type stagedBed struct {
	t              *testing.T
	bed            *testbed.Bed
	client, server *testbed.Pod
	be             *Backend
	mode           xtables.Mode
	log            *nflog.Conn
}

func newStagedBed(t *testing.T, mode xtables.Mode) *stagedBed {
	kerneltest.Require(t, "ip", "ipset", "iptables-"+string(mode)+"-restore", "ip6tables-"+string(mode)+"-restore")
	bed, err := testbed.New(testbed.Config{IPv4: true, IPv6: true, TCPPorts: []uint16{80, 81}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Errorf("closing the bed: %v", err)
		}
	})
	sb := &stagedBed{t: t, bed: bed, mode: mode}
	if sb.client, err = bed.AddPod("x", "client"); err != nil {
		t.Fatal(err)
	}
	if sb.server, err = bed.AddPod("x", "server"); err != nil {
		t.Fatal(err)
	}
	sb.inNode(func() (err error) {
		if sb.log, err = nflog.Open(stagedLogGroup); err != nil {
			return err
		}
		t.Cleanup(func() { sb.log.Close() })
		sb.be, err = New(context.Background(), mode)
		if err != nil {
			return err
		}
		sb.be.SetStagedLog(&policy.DropLog{Group: stagedLogGroup, Rate: 1000, Burst: 1000})
		return nil
	})
	return sb
}

func (sb *stagedBed) inNode(fn func() error) {
	sb.t.Helper()
	if err := sb.bed.InNode(fn); err != nil {
		sb.t.Fatal(err)
	}
}

// compile compiles the bed's pods (labelled app=<name>) with policies, as node n1 would.
func (sb *stagedBed) compile(policies ...*networkingv1.NetworkPolicy) *policy.Ruleset {
	st := cluster.NewState()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	cluster.DefaultNamespace(ns)
	st.Namespaces["x"] = ns
	for _, p := range []*testbed.Pod{sb.client, sb.server} {
		st.Pods.Set(cluster.Key("x", p.Name), cluster.PodOf(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: p.Name, Labels: map[string]string{"app": p.Name}},
			Spec:       corev1.PodSpec{NodeName: "n1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				PodIPs: []corev1.PodIP{{IP: p.IPv4.String()}, {IP: p.IPv6.String()}}},
		}))
	}
	for _, np := range policies {
		cluster.DefaultNetworkPolicy(np)
		st.Policies[cluster.Key(np.Namespace, np.Name)] = np
	}
	rs, _ := policy.Compile(st, "n1")
	return rs
}

func (sb *stagedBed) sync(rs *policy.Ruleset) {
	sb.t.Helper()
	sb.inNode(func() error {
		if _, err := sb.be.Sync(context.Background(), rs); err != nil {
			return err
		}
		return sb.be.Verify(context.Background())
	})
}

// probe connects from the client to the server n times per family on port, and fails the test
// unless each connection succeeds (want) or times out.
func (sb *stagedBed) probe(port uint16, n int, want bool) {
	sb.t.Helper()
	var ps []testbed.Probe
	for range n {
		for _, fam := range []int{4, 6} {
			ps = append(ps, testbed.Probe{Src: sb.client, Dst: sb.server.IP(fam), Port: port, Protocol: testbed.TCP})
		}
	}
	for i, err := range sb.bed.ProbeAllResults(context.Background(), ps) {
		switch {
		case want && err != nil:
			sb.t.Errorf("%s (%s): blocked, want allowed: %v", ps[i], sb.mode, err)
		case !want && err == nil:
			sb.t.Errorf("%s (%s): allowed, want dropped", ps[i], sb.mode)
		case !want && !isTimeout(err):
			sb.t.Errorf("%s (%s): refused, not dropped: %v", ps[i], sb.mode, err)
		}
	}
	if sb.t.Failed() {
		sb.inNode(func() error {
			sb.t.Logf("kernel state:\n%s", ours(sb.t, sb.mode))
			return nil
		})
		sb.t.FailNow()
	}
}

// counters returns the staged counters by outcome and cause, summed over the families.
func (sb *stagedBed) counters() map[[2]string]uint64 {
	sb.t.Helper()
	out := map[[2]string]uint64{}
	sb.inNode(func() error {
		cs, err := sb.be.ReadStagedCounters(context.Background())
		for _, c := range cs {
			if !strings.Contains(c.Rule, outcomeChain(c.Outcome, c.Cause)) {
				return fmt.Errorf("counter %+v: its rule does not name its chain", c)
			}
			out[[2]string{c.Outcome, c.Cause}] += c.Packets
		}
		return err
	})
	return out
}

// logged reads NFLOG until a packet with prefix is seen, or fails the test after a while.
func (sb *stagedBed) logged(prefix string) {
	sb.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	if err := sb.log.SetReadDeadline(deadline); err != nil {
		sb.t.Fatal(err)
	}
	var seen []string
	for time.Now().Before(deadline) {
		pkts, err := sb.log.Receive()
		if errors.Is(err, nflog.ErrLost) {
			continue
		}
		if err != nil {
			sb.t.Fatalf("no NFLOG message with prefix %q (saw %q): %v", prefix, seen, err)
		}
		for _, p := range pkts {
			if p.Prefix == prefix {
				if p.Src != sb.client.IPv4 && p.Src != sb.client.IPv6 {
					sb.t.Fatalf("NFLOG %q of %s, not from the client", prefix, p.Src)
				}
				return
			}
			seen = append(seen, p.Prefix)
		}
	}
	sb.t.Fatalf("no NFLOG message with prefix %q (saw %q)", prefix, seen)
}

// causeOf returns the cause of rs's staged judgement naming exactly the policies and rule.
func causeOf(t *testing.T, rs *policy.Ruleset, rule string, policies ...string) string {
	t.Helper()
	if rs.Staged == nil {
		t.Fatal("no staged judgement")
	}
	for id, c := range rs.Staged.Causes {
		if slices.Equal(c.Policies, policies) && c.Rule == rule {
			return id
		}
	}
	t.Fatalf("no cause %v %q among %v", policies, rule, rs.Staged.Causes)
	return ""
}

func serverIngress(name string, staged bool, rules ...networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, Ingress: rules}}
	if staged {
		np.Annotations = map[string]string{policy.StagedAnnotation: "true"}
	}
	return np
}

// TestKernelStaged: with real connections on both iptables variants, staged policies change
// no verdict and the kernel counts (and logs) what they would change, per cause. (a) A staged
// deny-all ingress policy on the server: every connection succeeds, each counted once as a
// would-deny of its isolation. (b) An enforced deny-all with a staged policy admitting port
// 81: connections to 81 still time out and count as would-allow of the staged rule (each SYN
// is a new connection to the kernel, so at least once each); those to 80 count nothing. The
// staged chains go when the staged policies do, and what is left is what a plain render
// writes.
func TestKernelStaged(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			sb := newStagedBed(t, mode)
			const n = 3

			// (a)
			rs := sb.compile(serverIngress("deny-all", true))
			isolation := causeOf(t, rs, "isolation: no rule admits", "x/deny-all")
			sb.sync(rs)
			before := sb.counters()
			sb.probe(80, n, true)
			sb.probe(81, n, true)
			got := sb.counters()
			if d := got[[2]string{policy.WouldDeny, isolation}] - before[[2]string{policy.WouldDeny, isolation}]; d != 4*n {
				t.Fatalf("would-deny of the staged isolation counted %d, want %d (one per connection): %v", d, 4*n, got)
			}
			for k, v := range got {
				if k[1] != isolation && v != 0 {
					t.Errorf("%v counted %d", k, v)
				}
			}
			t.Logf("after (a): %v", got)
			sb.logged(policy.StagedLogID(policy.WouldDeny, isolation))

			// (b) incrementally.
			port81 := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: &intstr.IntOrString{IntVal: 81}}}}
			rs = sb.compile(serverIngress("deny-all", false), serverIngress("allow-81", true, port81))
			rule0 := causeOf(t, rs, "rule 0", "x/allow-81")
			sb.sync(rs)
			before = sb.counters()
			sb.probe(80, n, false)
			if got := sb.counters(); !maps.Equal(got, before) {
				t.Fatalf("connections to 80, denied either way, were counted: %v, before %v", got, before)
			}
			sb.probe(81, n, false)
			got = sb.counters()
			if d := got[[2]string{policy.WouldAllow, rule0}] - before[[2]string{policy.WouldAllow, rule0}]; d < 2*n {
				t.Fatalf("would-allow of the staged rule counted %d, want at least %d: %v", d, 2*n, got)
			}
			t.Logf("after (b): %v", got)
			sb.logged(policy.StagedLogID(policy.WouldAllow, rule0))

			// Without staged policies: the enforced deny-all, as a fresh render writes it.
			plain := sb.compile(serverIngress("deny-all", false))
			sb.sync(plain)
			sb.probe(81, 1, false)
			sb.inNode(func() error {
				if _, err := sb.be.Compact(context.Background()); err != nil {
					return err
				}
				if err := sb.be.Verify(context.Background()); err != nil {
					return err
				}
				if cs, err := sb.be.ReadStagedCounters(context.Background()); err != nil || len(cs) != 0 {
					return fmt.Errorf("staged counters without staged policies: %v %v", cs, err)
				}
				incremental := ours(t, mode)
				fresh, err := New(context.Background(), mode)
				if err != nil {
					return err
				}
				if _, err := fresh.FullSync(context.Background(), plain); err != nil {
					return err
				}
				if full := ours(t, mode); full != incremental {
					return fmt.Errorf("incremental and full sync differ:\nincremental:\n%s\nfull:\n%s", incremental, full)
				}
				if err := fresh.Cleanup(context.Background()); err != nil {
					return err
				}
				if got := ours(t, mode); got != "" {
					return fmt.Errorf("left after cleanup:\n%s", got)
				}
				return nil
			})
		})
	}
}
