// Package bench measures the NetworkPolicy dataplane at the scale the issues set: a synthetic
// cluster of 5,000 pods (110 on this node), 1,000 namespaces and 10,000 policies. Run it with
// `make bench`. Each benchmark reports its figures as custom metrics.
package bench

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

func requireRoot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: kernel benchmark needs root for network namespaces and nftables")
	}
}

func newBed(b *testing.B) *testbed.Bed {
	bed, err := testbed.New(testbed.Config{Topology: testbed.Routed, IPv4: true, TCPPorts: []uint16{80}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bed.Close() })
	return bed
}

// inNode runs fn with nft commands going to the bed's node network namespace.
func inNode(b *testing.B, bed *testbed.Bed, fn func() error) {
	b.Helper()
	if err := bed.InNode(fn); err != nil {
		b.Fatal(err)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkFullSync measures compile plus one transaction that loads the whole table into an
// empty node.
func BenchmarkFullSync(b *testing.B) {
	requireRoot(b)
	for _, k := range []int{1, 10} {
		b.Run(fmt.Sprintf("scale=%dx", k), func(b *testing.B) {
			spec := synth.Default().Scale(k)
			st := synth.Generate(spec)
			bed := newBed(b)
			var compile, apply time.Duration
			var stats nftables.Stats
			for b.Loop() {
				inNode(b, bed, func() error {
					be, err := nftables.New()
					if err != nil {
						return err
					}
					if err := be.Cleanup(context.Background()); err != nil {
						return err
					}
					start := time.Now()
					rs, _ := policy.NewCompiler(spec.LocalNode).Compile(st)
					r := nftables.Render(rs)
					compile = time.Since(start)
					start = time.Now()
					if _, err := be.FullSyncRendered(context.Background(), r); err != nil {
						return err
					}
					apply = time.Since(start)
					stats = r.Stats()
					return nil
				})
			}
			b.ReportMetric(ms(compile), "compile-ms")
			b.ReportMetric(ms(apply), "apply-ms")
			b.ReportMetric(ms(compile+apply), "fullsync-ms")
			b.ReportMetric(float64(stats.Chains), "chains")
			b.ReportMetric(float64(stats.Rules), "rules")
			b.ReportMetric(float64(stats.Sets), "sets")
			b.ReportMetric(float64(stats.Elements), "elements")
		})
	}
}

// change is one event, applied to the source's objects as an event handler would, and its
// undoing.
type change struct {
	name        string
	apply, undo func(t *cluster.Tracker, base *cluster.State, i int)
}

// changes are the events of the incremental benchmark. Each is applied to the loaded base
// state and then undone (unmeasured), so every measurement is one change on the same table.
var changes = []change{
	{"pod-added", func(t *cluster.Tracker, base *cluster.State, i int) {
		p := *base.Pods.Get(cluster.Key("ns-00003", "pod-000003"))
		p.Name = fmt.Sprintf("added-%d", i)
		p.NodeName = "node-7"
		p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})}
		t.SetPod(p.Key(), &p)
	}, func(t *cluster.Tracker, _ *cluster.State, i int) {
		t.SetPod(cluster.Key("ns-00003", fmt.Sprintf("added-%d", i)), nil)
	}},
	{"local-pod-added", func(t *cluster.Tracker, base *cluster.State, i int) {
		p := *base.Pods.Get(cluster.Key("ns-00003", "pod-000003"))
		p.Name = fmt.Sprintf("added-%d", i)
		p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(i)})}
		t.SetPod(p.Key(), &p)
	}, func(t *cluster.Tracker, _ *cluster.State, i int) {
		t.SetPod(cluster.Key("ns-00003", fmt.Sprintf("added-%d", i)), nil)
	}},
	{"label-changed", func(t *cluster.Tracker, base *cluster.State, i int) {
		k := cluster.Key("ns-00001", "pod-000001")
		p := *base.Pods.Get(k) // a copy: the base's pod, and its labels, are shared
		p.Labels = maps.Clone(p.Labels)
		p.Labels["app"] = fmt.Sprintf("app-%d", 1+i%9)
		t.SetPod(k, &p)
	}, func(t *cluster.Tracker, base *cluster.State, _ int) {
		k := cluster.Key("ns-00001", "pod-000001")
		t.SetPod(k, base.Pods.Get(k))
	}},
	{"policy-added", func(t *cluster.Tracker, _ *cluster.State, i int) {
		tcp := corev1.ProtocolTCP
		port := intstr.FromInt32(int32(1000 + i))
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns-00002", Name: fmt.Sprintf("added-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%10)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		}
		cluster.DefaultNetworkPolicy(np)
		t.SetPolicy(cluster.Key(np.Namespace, np.Name), np)
	}, func(t *cluster.Tracker, _ *cluster.State, i int) {
		t.SetPolicy(cluster.Key("ns-00002", fmt.Sprintf("added-%d", i)), nil)
	}},
	{"policy-deleted", func(t *cluster.Tracker, _ *cluster.State, _ int) {
		t.SetPolicy(cluster.Key("ns-00004", "np-000004"), nil) // default deny of a local pod's namespace
	}, func(t *cluster.Tracker, base *cluster.State, _ int) {
		k := cluster.Key("ns-00004", "np-000004")
		t.SetPolicy(k, base.Policies[k])
	}},
}

// incrementalChanges is how many changes a run measures: enough at 1x for the 99th
// percentile to be a percentile and not the maximum (p99 of 200 is the second worst); at 10x,
// where each change costs ten times more, 40.
func incrementalChanges(base *cluster.State) int {
	if base.Pods.Len() > 10000 {
		return 40
	}
	return 200
}

// BenchmarkIncremental measures single changes on a loaded node, each from the event in the
// source to the kernel updated (snapshot, compile, render, diff and one nft transaction), and
// the size of that transaction, at 1x and 10x the cluster.
func BenchmarkIncremental(b *testing.B) {
	requireRoot(b)
	for _, k := range []int{1, 10} {
		spec := synth.Default().Scale(k)
		base := synth.Generate(spec)
		for _, ch := range changes {
			b.Run(fmt.Sprintf("scale=%dx/%s", k, ch.name), func(b *testing.B) {
				benchIncremental(b, spec.LocalNode, base, ch, func() (policy.Backend, error) { return nftables.New() })
			})
		}
	}
}

// benchIncremental loads base into a fresh node through the backend newBackend makes, then
// applies each change to the kernel and back, reporting the latency of the change (snapshot,
// compile, render, diff and one transaction) and the size of its transaction. The snapshots
// come from a cluster.Tracker, as the API source's do. For a backend that defers removals,
// it also reports how many changes did and the median time of compacting them.
func benchIncremental(b *testing.B, node string, base *cluster.State, ch change, newBackend func() (policy.Backend, error)) {
	bed := newBed(b)
	var latencies, compactions []time.Duration
	var ops []int
	inNode(b, bed, func() error {
		be, err := newBackend()
		if err != nil {
			return err
		}
		c := policy.NewCompiler(node)
		objects := cluster.NewTrackerFrom(base)
		rs, _ := c.Compile(objects.Snapshot())
		if _, err := be.FullSync(context.Background(), rs); err != nil {
			return err
		}
		// A fixed number of changes per run, so that `-benchtime 1x` still yields percentiles.
		n := incrementalChanges(base)
		// The full sync's garbage is not the changes' to collect.
		runtime.GC()
		for b.Loop() {
			for i := 1; i <= n; i++ {
				ch.apply(objects, base, i)
				start := time.Now()
				rs, _ := c.Compile(objects.Snapshot())
				res, err := be.Sync(context.Background(), rs)
				if err != nil {
					return err
				}
				latencies = append(latencies, time.Since(start))
				ops = append(ops, res.Operations)
				if res.Full {
					return fmt.Errorf("incremental sync fell back to a full one: %s", res.Fallback)
				}
				b.StopTimer()
				// The agent compacts a backend's deferred removals once the node is quiet;
				// each change here starts from a compacted node, and the compaction is
				// reported on its own.
				if cp, ok := be.(dataplane.Compactor); ok && cp.CompactionPending() {
					start := time.Now()
					if _, err := cp.Compact(context.Background()); err != nil {
						return err
					}
					compactions = append(compactions, time.Since(start))
				}
				ch.undo(objects, base, i)
				rs, _ = c.Compile(objects.Snapshot())
				if _, err := be.Sync(context.Background(), rs); err != nil {
					return err
				}
				if cp, ok := be.(dataplane.Compactor); ok && cp.CompactionPending() {
					if _, err := cp.Compact(context.Background()); err != nil {
						return err
					}
				}
				b.StartTimer()
			}
		}
		if err := be.Verify(context.Background()); err != nil {
			return err
		}
		return be.Cleanup(context.Background())
	})
	slices.Sort(latencies)
	slices.Sort(ops)
	b.ReportMetric(ms(latencies[len(latencies)/2]), "p50-ms")
	b.ReportMetric(ms(latencies[len(latencies)*99/100]), "p99-ms")
	b.ReportMetric(float64(ops[len(ops)/2]), "p50-tx-ops")
	b.ReportMetric(float64(ops[len(ops)-1]), "max-tx-ops")
	if len(compactions) > 0 {
		slices.Sort(compactions)
		b.ReportMetric(float64(len(compactions)), "compactions")
		b.ReportMetric(ms(compactions[len(compactions)/2]), "compact-p50-ms")
	}
}

// BenchmarkConnRate measures new TCP connections per second from a client pod to a server pod
// through the node, with no rules and with the whole benchmark cluster's policies loaded. The
// server's namespace is isolated and the flow is allowed only by the policy that sorts last.
func BenchmarkConnRate(b *testing.B) {
	connRate(b, synth.Default(), func() (policy.Backend, error) { return nftables.New() })
}

// connRate measures the connection rate of three configurations of one backend: no rules, our
// hooks with an empty ruleset (stateful filtering before any policy rule), and the benchmark
// cluster's policies. A round measures each configuration once, on nodes of its own, in an
// order that rotates, and gives paired ratios; their medians are reported, so that a drift of
// the machine's speed during the run cancels out.
//
// The nodes themselves differ: with the same configuration on two of them, their rates differed
// by up to 2% in one run and not at all in the next (seen in A/A runs). So the run is split into
// epochs, each on three new nodes, and the configurations take turns in the order the nodes are
// created: each spends as many rounds on nodes of each position as the others, and each leads a
// round equally often. New nodes, rather than reloading the old ones, so that no configuration
// inherits what another left in a namespace (a legacy iptables filter table stays hooked until
// its namespace goes, and conntrack entries stay until they time out); an epoch's nodes are
// removed before the next epoch's are made.
//
// In a run of 30 epochs of 6 rounds, one node's own offset had a spread (sd) of 1.9%, larger
// than what 100 rounds leave of the 12% spread of one round's ratio; more epochs are what
// narrows the result. ratio-ci90-lo and -hi bound the ratio by resampling whole epochs, so a
// reader sees how far one run's figure can be trusted.
func connRate(b *testing.B, spec synth.Spec, newBackend func() (policy.Backend, error)) {
	requireRoot(b)
	// Short rounds: on a shared host the speed drifts within seconds (30% steal time and
	// rates moving between 6,000 and 12,000 conn/s in one run were seen), and only drift
	// slower than a round cancels in its paired ratios.
	const (
		epochs         = 12 // a multiple of the node count, so each configuration takes each position alike
		roundsPerEpoch = 9  // a multiple of the node count, so each configuration leads alike
		window         = 200 * time.Millisecond
	)
	configs := []string{"no-rules", "hooks-only", "10k-policies"}
	if spec.ClusterPolicies > 0 {
		configs[2] = fmt.Sprintf("10k-policies+%d-cnp", spec.ClusterPolicies)
	}
	type node struct {
		bed    *testbed.Bed
		client *testbed.Pod
		dst    netip.AddrPort
	}
	// newNode creates a node with a server and a client pod and loads configuration cfg.
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
		var rs *policy.Ruleset
		switch cfg {
		case 1:
			rs, _ = policy.Compile(cluster.NewState(), spec.LocalNode)
		case 2:
			// The pods of every node have addresses of their own, so each needs its own ruleset.
			spec.LocalIPs = []netip.Addr{server.IPv4, n.client.IPv4}
			st := synth.Generate(spec)
			allowLast(st, "ns-00000", "ns-00001")
			var stats policy.Stats
			if rs, stats = policy.Compile(st, spec.LocalNode); stats.IsolatedPods == 0 {
				b.Fatal("no pod isolated")
			}
		}
		if rs != nil {
			if err := bed.InNode(func() error {
				be, err := newBackend()
				if err != nil {
					return err
				}
				_, err = be.FullSync(context.Background(), rs)
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
		if connect(b, n.client, n.dst, 300*time.Millisecond, 1) == 0 {
			b.Fatalf("%s: client cannot reach server", configs[cfg])
		}
		return n
	}
	rates := make([][]float64, len(configs)) // by configuration, one per round
	for b.Loop() {
		for epoch := range epochs {
			// nodes[k] runs configuration (k+epoch) % 3.
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
				if err := n.bed.Close(); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	median := func(v []float64) float64 { return slices.Sorted(slices.Values(v))[len(v)/2] }
	// pairedRatios are configuration a's rate over b's in the same round, by round.
	pairedRatios := func(a, b int) []float64 {
		r := make([]float64, len(rates[a]))
		for i := range r {
			r[i] = rates[a][i] / rates[b][i]
		}
		return r
	}
	for cfg, name := range configs {
		b.ReportMetric(median(rates[cfg]), "conn/s-"+name)
	}
	ratios := pairedRatios(2, 0)
	b.ReportMetric(median(ratios), "ratio")
	lo, hi := epochBootstrap(ratios, epochs, median)
	b.ReportMetric(lo, "ratio-ci90-lo")
	b.ReportMetric(hi, "ratio-ci90-hi")
	b.ReportMetric(median(pairedRatios(2, 1)), "ratio-vs-hooks")
}

// epochBootstrap gives a 90% interval of stat over per-round values that come in equal,
// consecutive epochs: it redraws whole epochs with replacement, because the rounds of one
// epoch share their nodes' offsets and are not independent of each other.
func epochBootstrap(v []float64, epochs int, stat func([]float64) float64) (lo, hi float64) {
	per := len(v) / epochs
	rng := rand.New(rand.NewPCG(1, 2)) // fixed: the same data gives the same interval
	const draws = 2000
	stats := make([]float64, draws)
	sample := make([]float64, 0, len(v))
	for d := range stats {
		sample = sample[:0]
		for range epochs {
			e := rng.IntN(epochs)
			sample = append(sample, v[e*per:(e+1)*per]...)
		}
		stats[d] = stat(sample)
	}
	slices.Sort(stats)
	return stats[draws*5/100], stats[draws*95/100]
}

// allowLast adds the policies that admit client -> server, named to sort after every other
// policy in their namespaces.
func allowLast(st *cluster.State, serverNS, clientNS string) {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(80)
	in := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: serverNS, Name: "zz-allow-bench"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}, Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				cluster.NamespaceNameLabel: clientNS}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		}}},
	}
	out := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: clientNS, Name: "zz-allow-bench"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
					cluster.NamespaceNameLabel: serverNS}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}}},
	}
	for _, np := range []*networkingv1.NetworkPolicy{in, out} {
		cluster.DefaultNetworkPolicy(np)
		st.Policies[cluster.Key(np.Namespace, np.Name)] = np
	}
}

// connect opens and resets TCP connections from the client pod for d with workers in
// parallel, and returns connections per second.
func connect(b *testing.B, client *testbed.Pod, dst netip.AddrPort, d time.Duration, workers int) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			orig, _ := netns.Get()
			defer orig.Close()
			target, err := netns.GetFromName(client.NetNSName)
			if err != nil {
				b.Error(err)
				return
			}
			defer target.Close()
			if err := netns.Set(target); err != nil {
				b.Error(err)
				return
			}
			defer netns.Set(orig)
			dialer := net.Dialer{Timeout: time.Second, Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) {
					// RST on close: no TIME_WAIT, so ports never run out.
					_ = syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0})
				})
			}}
			for time.Now().Before(deadline) {
				c, err := dialer.Dial("tcp", dst.String())
				if err != nil {
					continue
				}
				c.Close()
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(total.Load()) / d.Seconds()
}

// settle collects the garbage of loading a ruleset before a rate is measured: the client runs
// in this process, and a collection during its measurement would be charged to the rules.
func settle() { runtime.GC() }
