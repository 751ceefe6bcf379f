package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestSyncWaitHoldsTheWrite is the regression test of issue 17's "IPv6 UDP flow allowed that the
// policies deny". The wait tests used then counted the agent's sync log lines, and the agent logs
// two at startup: its first full sync, and ~200 ms later a "no change" pass over the same state
// (the source's initial notification). A wait begun between the two took the second for the sync
// of its own write, and the probe that followed ran on the old rules (16 of 17 runs of this
// scenario, and "was transient" flows in round 1 of the random test). The wait now reads the
// agent's status for the content it wrote, so it must hold here every time.
//
// The race is staged: the state before the change is on disk when the agent starts, the change
// is written right after the first sync, and events on a dot file keep the manifests source
// from reading the directory for its maximum debounce of one second, so that the agent's
// startup lines all come before the change is read.
func TestSyncWaitHoldsTheWrite(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nftablesBackend, testbed.Routed, true, true)
	w.addNamespace("x", map[string]string{"ns": "x"})
	w.addNamespace("y", map[string]string{"ns": "y"})
	w.addPod(t, "x", "a", map[string]string{"pod": "a"}, cport("dns", 80, udp))
	w.addPod(t, "y", "b", map[string]string{"pod": "b"})
	if err := w.sim.SetState(w.objects()...); err != nil {
		t.Fatal(err)
	}
	if err := w.sim.StartAgent("--resync-period", "30s"); err != nil {
		t.Fatal(err)
	}
	if err := w.sim.WaitApplied(15 * time.Second); err != nil {
		t.Fatal(err)
	}

	// The change: x/a isolated for ingress, allowing only namespace z (which does not exist).
	w.policies["x/only-z"] = withIngress(netpol("x", "only-z", sel("pod", "a")), from(peers(nsPeer(selp("ns", "z")))))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = os.WriteFile(filepath.Join(w.sim.Dir, ".busy"), []byte(time.Now().String()), 0o644)
			}
		}
	}()
	err := w.sim.Apply(w.objects()...)
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	ok, perr := w.sim.Bed.ProbeResult(context.Background(), testbed.Probe{
		Src: w.tpods["y/b"], Dst: w.tpods["x/a"].IPv6, Port: 80, Protocol: testbed.UDP})
	if ok {
		table, _ := w.sim.Nft("list", "table", "inet", "netwarden")
		t.Fatalf("the wait returned before the agent applied the write: y/b -> x/a UDP/80 over IPv6 was "+
			"allowed, policy x/only-z denies it; the kernel holds chain in/x/only-z-v6: %v\nagent log:\n%s",
			strings.Contains(table, "in/x/only-z-v6"), tail(w.sim.Log(), 12))
	}
	t.Logf("blocked as the policy says (%v)", perr)
}
