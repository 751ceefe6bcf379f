package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// streamPort is where the server pod echoes long-lived streams (TCP) and datagrams (UDP).
const streamPort = 7000

// TestEstablishedFlowsCut opens a TCP stream and a UDP flow from an allowed and from a denied
// client to a server, then applies a policy that admits only the allowed client, while all
// four flows carry a numbered message every 2 ms, each echoed back. No message the denied
// client writes after the agent reports established flows judged by the policy is echoed; the allowed client's
// flows go on with every message echoed in order. Twenty rounds per backend, each with new flows (and
// the policy removed in between, which must let new flows through again), so a race with
// conntrack pickup would show. Then --keep-established keeps the denied flows going.
func TestEstablishedFlowsCut(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{nftablesBackend, iptablesNFT}, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", nil)
		w.addPod(t, "x", "srv", map[string]string{"app": "srv"})
		w.addPod(t, "x", "good", map[string]string{"role": "good"})
		w.addPod(t, "x", "bad", map[string]string{"role": "bad"})
		stop, err := w.tpods["x/srv"].ServeEcho(streamPort)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		base := w.objects()
		if err := w.sim.SetState(base...); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.StartAgent(); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		deny := withIngress(netpol("x", "only-good", sel("app", "srv")), from(peers(podPeer(selp("role", "good")))))
		srv := netip.AddrPortFrom(w.tpods["x/srv"].IPv4, streamPort)
		open := func(p *testbed.Pod) []*testbed.Flow {
			tcp, udp, err := testbed.OpenFlows(p, srv)
			if err != nil {
				t.Fatal(err)
			}
			return []*testbed.Flow{tcp, udp}
		}
		round := func(t *testing.T, i int, keep bool) {
			good, bad := open(w.tpods["x/good"]), open(w.tpods["x/bad"])
			for _, f := range append(good, bad...) {
				defer f.Close()
				if err := f.WaitEchoes(3, 10*time.Second); err != nil {
					t.Fatalf("round %d, before the policy: %v", i, err)
				}
			}
			if err := w.sim.SetState(append(base, deny)...); err != nil {
				t.Fatal(err)
			}
			if err := w.sim.WaitEstablished(15 * time.Second); err != nil {
				t.Fatal(err)
			}
			// The agent reports established flows judged by a change's rules only after it
			// flagged the ones they deny, so no message written from now on may come back on a
			// denied flow, however late the test reads it. The allowed flows must echo such
			// messages, each one, in order.
			goodSent, badSent := []int64{good[0].Sent(), good[1].Sent()}, []int64{bad[0].Sent(), bad[1].Sent()}
			for k, f := range good {
				if err := f.WaitEchoes(goodSent[k]+25, 10*time.Second); err != nil {
					t.Errorf("round %d: allowed %s flow after the policy: %v", i, f.Proto, err)
				}
			}
			if keep {
				for k, f := range bad {
					if err := f.WaitEchoes(badSent[k]+25, 10*time.Second); err != nil {
						t.Errorf("round %d: with --keep-established, the denied %s flow: %v", i, f.Proto, err)
					}
				}
			} else {
				// The allowed flows' 25 messages took as long as a denied one's echo would.
				time.Sleep(20 * time.Millisecond)
				for k, f := range bad {
					if n := f.Echoes(); n > badSent[k] {
						t.Errorf("round %d: denied %s flow echoed message %d, written after the policy applied (%d were before)", i, f.Proto, n-1, badSent[k])
					}
				}
			}
			if err := w.sim.Apply(base...); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 20 {
			round(t, i, false)
			if t.Failed() {
				return
			}
		}
		if err := w.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.StartAgent("--keep-established"); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		round(t, 0, true)
	})
}
