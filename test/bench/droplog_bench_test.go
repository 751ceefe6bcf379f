package bench

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/nflog"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// BenchmarkConnRateDropLog compares the new-connection rate through the benchmark cluster's
// policies with drop logging on (log rules before every drop, and a reader bound to the
// group, as the agent runs it) and off, on each backend; and on nftables with the per-policy
// counters on and off. ratio is on over off; the target is at least 0.95. The rounds
// are paired and rotated as in connRate, so that drift of a shared machine cancels out.
func BenchmarkConnRateDropLog(b *testing.B) {
	logOn := func(be policy.Backend) bool {
		be.(policy.DropLogger).SetDropLog(&policy.DropLog{Group: 100, Rate: 10, Burst: 20})
		return true
	}
	b.Run("nftables", func(b *testing.B) {
		connRateWith(b, func() (policy.Backend, error) { return nftables.New() }, logOn, nil)
	})
	b.Run("iptables-nft", func(b *testing.B) {
		connRateWith(b, func() (policy.Backend, error) { return newIPTables(xtables.ModeNFT) }, logOn, nil)
	})
	b.Run("nftables-counters", func(b *testing.B) {
		connRateWith(b, func() (policy.Backend, error) { return nftables.New() }, func(be policy.Backend) bool {
			be.(policy.PolicyCounters).SetPolicyCounters(true)
			return false
		}, nil)
	})
}

// BenchmarkConnRateStaged compares the new-connection rate through the benchmark cluster's
// policies with staged policies (the kernel judging each new connection also as they would)
// and without, on each backend; ratio is with over without, and the target is at least
// 0.95. "elsewhere" stages a deny-all in a namespace of neither pod, the common case: the
// connection meets only the staged base chain. "on-the-flow" stages a deny-all of the server's
// ingress and of the client's egress, the worst case: both directions of every connection are
// judged a second time, through every rule of the policies selecting the pods (the flow is
// admitted by the policy that sorts last), with the staged log on.
func BenchmarkConnRateStaged(b *testing.B) {
	stagedDenyAll := func(ns string, types ...networkingv1.PolicyType) func(*cluster.State) {
		return func(st *cluster.State) {
			np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staged-deny-all-" + string(types[0]),
				Annotations: map[string]string{policy.StagedAnnotation: "true"}},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: types}}
			cluster.DefaultNetworkPolicy(np)
			st.Policies[cluster.Key(np.Namespace, np.Name)] = np
		}
	}
	logOn := func(be policy.Backend) bool {
		be.(policy.StagedReporter).SetStagedLog(&policy.DropLog{Group: 100, Rate: 10, Burst: 20})
		return true
	}
	onTheFlow := func(st *cluster.State) {
		stagedDenyAll("ns-00000", networkingv1.PolicyTypeIngress)(st)
		stagedDenyAll("ns-00001", networkingv1.PolicyTypeEgress)(st)
	}
	for _, be := range []struct {
		name string
		open func() (policy.Backend, error)
	}{
		{"nftables", func() (policy.Backend, error) { return nftables.New() }},
		{"iptables-nft", func() (policy.Backend, error) { return newIPTables(xtables.ModeNFT) }},
	} {
		b.Run(be.name+"/elsewhere", func(b *testing.B) {
			connRateWith(b, be.open, func(policy.Backend) bool { return false }, stagedDenyAll("ns-00002", networkingv1.PolicyTypeIngress))
		})
		b.Run(be.name+"/on-the-flow", func(b *testing.B) { connRateWith(b, be.open, logOn, onTheFlow) })
	}
}

// connRateWith measures the connection rate of the benchmark cluster's policies on backends
// as newBackend makes them ("off") and after on changes them ("on"); on reports whether the
// "on" nodes need a reader of the drop log group. onState, when set, changes the cluster the
// "on" nodes load.
func connRateWith(b *testing.B, newBackend func() (policy.Backend, error), on func(policy.Backend) bool, onState func(*cluster.State)) {
	requireRoot(b)
	const (
		epochs         = 8
		roundsPerEpoch = 8
		window         = 200 * time.Millisecond
		group          = 100 // as logOn sets it
	)
	configs := []string{"off", "on"}
	spec := synth.Default()
	type node struct {
		bed    *testbed.Bed
		client *testbed.Pod
		dst    netip.AddrPort
		reader *nflog.Conn
	}
	newNode := func(cfg int) *node {
		bed := newBed(b)
		server, err := bed.AddPod("ns-00000", "pod-000000")
		if err != nil {
			b.Fatal(err)
		}
		n := &node{bed: bed, dst: netip.AddrPortFrom(server.IPv4, 80)}
		if n.client, err = bed.AddPod("ns-00001", "pod-000001"); err != nil {
			b.Fatal(err)
		}
		spec.LocalIPs = []netip.Addr{server.IPv4, n.client.IPv4}
		st := synth.Generate(spec)
		allowLast(st, "ns-00000", "ns-00001")
		if cfg == 1 && onState != nil {
			onState(st)
		}
		rs, stats := policy.Compile(st, spec.LocalNode)
		if stats.IsolatedPods == 0 {
			b.Fatal("no pod isolated")
		}
		if cfg == 1 && onState != nil && stats.Staged == 0 {
			b.Fatal("nothing staged")
		}
		if err := bed.InNode(func() error {
			be, err := newBackend()
			if err != nil {
				return err
			}
			if cfg == 1 && on(be) {
				// The reader's socket belongs to the namespace it is opened in.
				if n.reader, err = nflog.Open(group); err != nil {
					return err
				}
				go func() {
					for {
						if _, err := n.reader.Receive(); err != nil && !isLost(err) {
							return
						}
					}
				}()
			}
			_, err = be.FullSync(context.Background(), rs)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if connect(b, n.client, n.dst, 300*time.Millisecond, 1) == 0 {
			b.Fatalf("%s: client cannot reach server", configs[cfg])
		}
		return n
	}
	rates := make([][]float64, len(configs))
	for b.Loop() {
		for epoch := range epochs {
			nodes := make([]*node, len(configs))
			for k := range nodes {
				nodes[k] = newNode((k + epoch) % len(configs))
			}
			for round := range roundsPerEpoch {
				settle()
				for j := range nodes {
					k := (round + j) % len(nodes)
					cfg := (k + epoch) % len(configs)
					rates[cfg] = append(rates[cfg], connect(b, nodes[k].client, nodes[k].dst, window, 4))
				}
			}
			for _, n := range nodes {
				if n.reader != nil {
					n.reader.Close()
				}
				if err := n.bed.Close(); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	median := func(v []float64) float64 { return slices.Sorted(slices.Values(v))[len(v)/2] }
	ratios := make([]float64, len(rates[0]))
	for i := range ratios {
		ratios[i] = rates[1][i] / rates[0][i]
	}
	b.ReportMetric(median(rates[0]), "conn/s-off")
	b.ReportMetric(median(rates[1]), "conn/s-on")
	b.ReportMetric(median(ratios), "ratio")
	lo, hi := epochBootstrap(ratios, epochs, median)
	b.ReportMetric(lo, "ratio-ci90-lo")
	b.ReportMetric(hi, "ratio-ci90-hi")
}

func isLost(err error) bool { return errors.Is(err, nflog.ErrLost) }
