package bench

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

const establishedRounds = 10

// BenchmarkDeniedFlowStops measures how long an established TCP stream and UDP flow (a
// message every 2 ms, each echoed) go on after a policy that denies them is written: from the
// write to the last echo, p50 and max over the rounds, per backend. Beside it, from the write:
// the agent's status reporting the policy's rules applied ("applied": new connections are judged
// by them), and established flows re-judged by them ("established": the denied flows flagged).
func BenchmarkDeniedFlowStops(b *testing.B) {
	requireRoot(b)
	for _, backend := range []string{"nftables", "iptables"} {
		b.Run(backend, func(b *testing.B) {
			sim, err := simnode.New(simnode.Options{Bed: testbed.Config{Topology: testbed.Routed, IPv4: true,
				TCPPorts: []uint16{}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
			if err != nil {
				b.Fatal(err)
			}
			defer sim.Close()
			srvObj, srv, err := sim.AddPod("x", "srv", map[string]string{"app": "srv"})
			if err != nil {
				b.Fatal(err)
			}
			badObj, bad, err := sim.AddPod("x", "bad", map[string]string{"role": "bad"})
			if err != nil {
				b.Fatal(err)
			}
			stop, err := srv.ServeEcho(7000)
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			base := []runtime.Object{simnode.Namespace("x", nil), srvObj, badObj}
			deny := &networkingv1.NetworkPolicy{
				TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
				ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny-all-to-srv"},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "srv"}},
					PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
			}
			if err := sim.SetState(base...); err != nil {
				b.Fatal(err)
			}
			if err := sim.StartAgent("--backend", backend, "--log-level", "info"); err != nil {
				b.Fatal(err)
			}
			defer sim.StopAgent()
			if err := sim.WaitApplied(30 * time.Second); err != nil {
				b.Fatal(err)
			}
			var tcpCut, udpCut, applied, established []time.Duration
			for b.Loop() {
				tcpCut, udpCut, applied, established = nil, nil, nil, nil
				for range establishedRounds {
					tcp, udp, err := testbed.OpenFlows(bad, netip.AddrPortFrom(srv.IPv4, 7000))
					if err != nil {
						b.Fatal(err)
					}
					for _, f := range []*testbed.Flow{tcp, udp} {
						if err := f.WaitEchoes(3, 10*time.Second); err != nil {
							b.Fatal(err)
						}
					}
					start := time.Now()
					if err := sim.SetState(append(base, deny)...); err != nil {
						b.Fatal(err)
					}
					if err := sim.WaitApplied(30 * time.Second); err != nil {
						b.Fatal(err)
					}
					applied = append(applied, time.Since(start))
					if err := sim.WaitEstablished(30 * time.Second); err != nil {
						b.Fatal(err)
					}
					established = append(established, time.Since(start))
					// Quiet for 300 ms (150 messages) means stopped.
					for time.Since(tcp.LastEcho()) < 300*time.Millisecond || time.Since(udp.LastEcho()) < 300*time.Millisecond {
						if time.Since(start) > 10*time.Second {
							b.Fatalf("the denied flows still echo 10 s after the policy was written")
						}
						time.Sleep(10 * time.Millisecond)
					}
					tcpCut = append(tcpCut, max(0, tcp.LastEcho().Sub(start)))
					udpCut = append(udpCut, max(0, udp.LastEcho().Sub(start)))
					tcp.Close()
					udp.Close()
					if err := sim.Apply(base...); err != nil {
						b.Fatal(err)
					}
				}
			}
			report := func(ds []time.Duration, name string) {
				slices.Sort(ds)
				b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-p50-ms")
				b.ReportMetric(float64(ds[len(ds)-1].Microseconds())/1000, name+"-max-ms")
			}
			report(tcpCut, "tcp-cut")
			report(udpCut, "udp-cut")
			report(applied, "applied")
			report(established, "established")
		})
	}
}
