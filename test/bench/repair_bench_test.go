package bench

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/kernel/kernelwatch"
	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

const repairRounds = 100

// BenchmarkForeignChangeRepair measures, from outside the agent, how long the node's rules stay
// broken after another process breaks them: the nftables table deleted, or the jump into our
// iptables chains removed. nftables and iptables-nft: from the kernel's notification of the
// breaking commit to that of the agent's first repairing commit of the same table, both read by
// a watcher of the test's own in the node's namespace. iptables-legacy (no notifications): from
// the breaking command's return to the table's shape being back, polled every 0.5 ms. p50, p99
// and max over 100 rounds, the resync period at ten minutes so that only the agent's watch can
// repair.
func BenchmarkForeignChangeRepair(b *testing.B) {
	requireRoot(b)
	for _, be := range []struct{ name, backend, mode string }{
		{"nftables", "nftables", ""}, {"iptables-nft", "iptables", "nft"}, {"iptables-legacy", "iptables", "legacy"},
	} {
		b.Run(be.name, func(b *testing.B) {
			if be.mode != "" {
				b.Setenv("NETWARDEN_IPTABLES_MODE", be.mode)
			}
			sim, err := simnode.New(simnode.Options{Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, IPv6: true,
				TCPPorts: []uint16{}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
			if err != nil {
				b.Fatal(err)
			}
			defer sim.Close()
			pod, _, err := sim.AddPod("x", "a", map[string]string{"app": "a"})
			if err != nil {
				b.Fatal(err)
			}
			deny := &networkingv1.NetworkPolicy{
				TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
				ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny"},
				Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}},
			}
			if err := sim.SetState(simnode.Namespace("x", nil), pod, deny); err != nil {
				b.Fatal(err)
			}
			if err := sim.StartAgent("--backend", be.backend, "--resync-period", "10m"); err != nil {
				b.Fatal(err)
			}
			defer sim.StopAgent()
			if err := sim.WaitApplied(30 * time.Second); err != nil {
				b.Fatal(err)
			}
			breakCmd := []string{"nft", "delete", "table", "inet", "netwarden"}
			table := kernelwatch.Table{Family: "inet", Name: "netwarden"}
			if be.mode != "" {
				breakCmd = []string{"iptables-" + be.mode, "-t", "mangle", "-D", "FORWARD", "-j", "NETWARDEN-FORWARD"}
				table = kernelwatch.Table{Family: "ip", Name: "mangle"}
			}
			var ds []time.Duration
			for b.Loop() {
				ds = ds[:0]
				for range repairRounds {
					st, err := sim.Status()
					if err != nil || st.NetworkPolicy == nil {
						b.Fatalf("status: %+v %v", st, err)
					}
					repairs := st.NetworkPolicy.Repairs
					var d time.Duration
					if be.mode == "legacy" {
						d = legacyRepair(b, sim, breakCmd)
					} else {
						d = notifiedRepair(b, sim, table, breakCmd)
					}
					ds = append(ds, d)
					// The next round starts once the agent has finished this repair.
					if err := sim.WaitStatus(30*time.Second, "the repair", func(st statusapi.Status) bool {
						return st.NetworkPolicy != nil && st.NetworkPolicy.Repairs > repairs
					}); err != nil {
						b.Fatal(err)
					}
				}
			}
			slices.Sort(ds)
			if testing.Verbose() {
				b.Logf("repairs, sorted: %v\nagent log:\n%s", ds, sim.Log())
			}
			b.ReportMetric(ms(ds[len(ds)/2]), "repair-p50-ms")
			b.ReportMetric(ms(ds[(len(ds)*99+99)/100-1]), "repair-p99-ms")
			b.ReportMetric(ms(ds[len(ds)-1]), "repair-max-ms")
		})
	}
}

// notifiedRepair breaks the rules with cmd and returns the time between the kernel's
// notifications of the breaking commit and of the agent's first commit to the same table.
func notifiedRepair(b *testing.B, sim *simnode.Sim, table kernelwatch.Table, cmd []string) time.Duration {
	var w *kernelwatch.Watcher
	if err := sim.Bed.InNode(func() error {
		var err error
		w, err = kernelwatch.Open(kernelwatch.Config{Tables: []kernelwatch.Table{table}})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	changes := make(chan kernelwatch.Change, 64)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, func(c kernelwatch.Change) { changes <- c }) }()
	defer func() { cancel(); <-done }()
	var breaker int
	if err := sim.Bed.InNode(func() error {
		c := exec.Command(cmd[0], cmd[1:]...)
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v %s", cmd, err, out)
		}
		breaker = c.Process.Pid
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	var broke time.Time
	for {
		select {
		case c := <-changes:
			if c.PID == breaker {
				broke = c.At
				continue
			}
			if !broke.IsZero() {
				return c.At.Sub(broke)
			}
		case <-ctx.Done():
			b.Fatalf("no repair of %s within 20 s:\n%s", table, sim.Log())
		}
	}
}

// legacyRepair breaks the rules with cmd and returns the time from its return to the agent's
// first write to the mangle table after it (its shape changing again: the repair's restore of
// the policy chains comes first).
func legacyRepair(b *testing.B, sim *simnode.Sim, cmd []string) time.Duration {
	shape := func() kernelwatch.LegacyShape {
		var s kernelwatch.LegacyShape
		if err := sim.Bed.InNode(func() error {
			var err error
			s, err = kernelwatch.LegacyTable(false, "mangle")
			return err
		}); err != nil {
			b.Fatal(err)
		}
		return s
	}
	if out, err := sim.Bed.NodeExec(context.Background(), cmd[0], cmd[1:]...); err != nil {
		b.Fatalf("%v: %v %s", cmd, err, out)
	}
	broke := time.Now()
	broken := shape()
	for time.Since(broke) < 20*time.Second {
		if shape() != broken {
			return time.Since(broke)
		}
		time.Sleep(500 * time.Microsecond)
	}
	b.Fatalf("no repair within 20 s:\n%s", sim.Log())
	return 0
}
