package masquerade

import (
	"context"
	"fmt"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// inFreshNetNS runs fn in a new, empty network namespace (see testbed.InFreshNetNS).
func inFreshNetNS(t testing.TB, fn func()) {
	t.Helper()
	kerneltest.InFreshNetNS(t, fn, "nft", "iptables-nft-restore", "iptables-legacy-restore", "ipset")
}

type backendCase struct {
	name string
	new  func(t testing.TB) Backend
	// tamper removes part of what the backend installed, as an operator or another agent might.
	tamper func(t testing.TB)
	// leftovers lists what of ours is still in the kernel after Cleanup.
	leftovers func(t testing.TB) string
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func backendCases() []backendCase {
	cases := []backendCase{{
		name: "nftables",
		new: func(t testing.TB) Backend {
			b, err := NewNFTables()
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		tamper: func(t testing.TB) { run(t, "nft", "flush", "set", "inet", NFTablesTable, "nomasq-dst-v4") },
		leftovers: func(t testing.TB) string {
			if out := run(t, "nft", "list", "tables"); strings.Contains(out, NFTablesTable) {
				return out
			}
			return ""
		},
	}}
	for _, mode := range []xtables.Mode{xtables.ModeNFT, xtables.ModeLegacy} {
		cases = append(cases, backendCase{
			name: "iptables-" + string(mode),
			new: func(t testing.TB) Backend {
				r, err := xtables.NewRunner(context.Background(), mode)
				if err != nil {
					t.Fatal(err)
				}
				return NewIPTables(r)
			},
			tamper: func(t testing.TB) { run(t, "ip6tables-"+string(mode), "-t", "nat", "-F", IPTablesChain) },
			leftovers: func(t testing.TB) string {
				var left []string
				for _, tool := range []string{"iptables-", "ip6tables-"} {
					if out := run(t, tool+string(mode)+"-save", "-t", "nat"); strings.Contains(out, IPTablesChain) {
						left = append(left, out)
					}
				}
				if out := run(t, "ipset", "list", "-n"); strings.Contains(out, "nwmasq") {
					left = append(left, out)
				}
				return strings.Join(left, "\n")
			},
		})
	}
	return cases
}

func desiredWith(nonMasq ...string) *Desired {
	cfg := Config{NonMasqueradeCIDRs: mustPrefixes(nonMasq...)}
	nodes := map[string]*corev1.Node{"n1": node("n1", "10.244.1.0/24", "fd00:10:244:1::/64")}
	return Compute(cfg, Options{RandomFully: true}, nodes, "n1")
}

// TestBackendLifecycle drives each backend through what the agent does: a first full sync, an
// incremental change, drift found and repaired, a restart on existing state, and cleanup.
// Packets through these rules are tested in test/masquerade.
func TestBackendLifecycle(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			inFreshNetNS(t, func() {
				ctx := context.Background()
				b := bc.new(t)
				d1 := desiredWith("198.51.100.0/24", "2001:db8::/32")
				if res, err := b.FullSync(ctx, d1); err != nil || !res.Full {
					t.Fatalf("full sync: %+v %v", res, err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after full sync: %v", err)
				}
				// CIDRs adjacent to existing ones are added beside them (no element deleted);
				// one that contains two others replaces them. Verification compares addresses,
				// not how they are split. Ranges that end at the family's last address have no
				// interval-end element in nft's encoding; they are added here and removed below.
				d2 := desiredWith("198.51.100.0/24", "198.51.101.0/24", "198.51.102.0/24", "2001:db8::/32", "203.0.113.0/24",
					"240.0.0.0/4", "ff00::/8")
				res, err := b.Sync(ctx, d2)
				if err != nil || res.Full || res.Operations == 0 {
					t.Fatalf("incremental sync: %+v %v", res, err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after incremental sync: %v", err)
				}
				d2 = desiredWith("198.51.100.0/24", "198.51.101.0/24", "198.51.102.0/24", "2001:db8::/32", "203.0.113.0/24",
					"203.0.112.0/23", "198.51.100.0/23")
				if got := rangeStrings(d2.NoMasquerade[0]); !strings.Contains(got, "198.51.100.0/23,198.51.102.0/24") || !strings.Contains(got, "203.0.112.0/23") {
					t.Fatalf("merged ranges: %s", got)
				}
				if res, err = b.Sync(ctx, d2); err != nil || res.Full {
					t.Fatalf("incremental sync: %+v %v", res, err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after incremental sync: %v", err)
				}
				if res, err := b.Sync(ctx, d2); err != nil || res.Operations != 0 {
					t.Fatalf("a sync with no change must send nothing: %+v %v", res, err)
				}
				bc.tamper(t)
				if err := b.Verify(ctx); err == nil {
					t.Fatal("verify did not notice the tampering")
				}
				if _, err := b.FullSync(ctx, d2); err != nil {
					t.Fatalf("repair: %v", err)
				}
				if err := b.Verify(ctx); err != nil {
					t.Fatalf("verify after repair: %v", err)
				}
				// A new agent process on the existing state converges to its own view.
				restarted := bc.new(t)
				d3 := desiredWith("192.0.2.0/24")
				if _, err := restarted.FullSync(ctx, d3); err != nil {
					t.Fatalf("restart on existing state: %v", err)
				}
				if err := restarted.Verify(ctx); err != nil {
					t.Fatalf("verify after restart: %v", err)
				}
				// Every source masqueraded: a whole family is a /0, which hash:net holds as
				// two halves; incremental and full syncs both apply it.
				all := Compute(Config{NonMasqueradeCIDRs: mustPrefixes("192.0.2.0/24")}, Options{AllSources: true}, nil, "n1")
				if got := rangeStrings(all.Sources[0]) + " " + rangeStrings(all.Sources[1]); got != "0.0.0.0/0 ::/0" {
					t.Fatalf("all sources: %s", got)
				}
				if _, err := restarted.Sync(ctx, all); err != nil {
					t.Fatalf("incremental sync of every source: %v", err)
				}
				if err := restarted.Verify(ctx); err != nil {
					t.Fatalf("verify after masquerading every source: %v", err)
				}
				if _, err := restarted.FullSync(ctx, all); err != nil {
					t.Fatalf("full sync of every source: %v", err)
				}
				if err := restarted.Verify(ctx); err != nil {
					t.Fatalf("verify after a full sync of every source: %v", err)
				}
				if err := restarted.Cleanup(ctx); err != nil {
					t.Fatalf("cleanup: %v", err)
				}
				if left := bc.leftovers(t); left != "" {
					t.Fatalf("cleanup left:\n%s", left)
				}
				if err := restarted.Cleanup(ctx); err != nil {
					t.Fatalf("a second cleanup must succeed: %v", err)
				}
			})
		})
	}
}

// BenchmarkMasqueradeChange measures one change applied to the kernel with 1,000
// non-masquerade CIDRs loaded: a config change (one CIDR added to the file) and a Node added
// (its podCIDR outside every configured range), then both removed again. Reported as p50 and
// p99 in ms.
func BenchmarkMasqueradeChange(b *testing.B) {
	for _, bc := range backendCases() {
		b.Run(bc.name, func(b *testing.B) {
			inFreshNetNS(b, func() {
				ctx := context.Background()
				be := bc.new(b)
				var cidrs []netip.Prefix
				for i := range 1000 {
					// 1,000 disjoint, non-adjacent /24s.
					cidrs = append(cidrs, netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + i/128), byte(2 * (i % 128)), 0}), 24))
				}
				cfg := Config{NonMasqueradeCIDRs: cidrs, CidrLimit: 2000}
				nodes := map[string]*corev1.Node{"n1": node("n1", "10.244.1.0/24", "fd00:10:244:1::/64")}
				cur := Compute(cfg, Options{RandomFully: true}, nodes, "n1")
				if _, err := be.FullSync(ctx, cur); err != nil {
					b.Fatal(err)
				}
				const rounds = 40
				var configMs, nodeMs, removeMs []float64
				b.ResetTimer()
				for range b.N {
					for i := range rounds {
						// Config change: one more CIDR.
						next := cfg
						next.NonMasqueradeCIDRs = append(slices.Clone(cfg.NonMasqueradeCIDRs), netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(2 * i), 0}), 24))
						start := time.Now() // compute and apply, as the agent does on an event
						d := Compute(next, Options{RandomFully: true}, nodes, "n1")
						if _, err := be.Sync(ctx, d); err != nil {
							b.Fatal(err)
						}
						configMs = append(configMs, ms(time.Since(start)))
						// Node added, with a podCIDR outside every range.
						withNode := map[string]*corev1.Node{"n1": nodes["n1"], "new": node("new", fmt.Sprintf("172.30.%d.0/24", 2*i), fmt.Sprintf("fd00:30:%x::/64", i))}
						start = time.Now()
						d2 := Compute(next, Options{RandomFully: true}, withNode, "n1")
						if _, err := be.Sync(ctx, d2); err != nil {
							b.Fatal(err)
						}
						nodeMs = append(nodeMs, ms(time.Since(start)))
						// Back to the starting state: a CIDR and a Node removed, which deletes
						// elements.
						start = time.Now()
						if _, err := be.Sync(ctx, Compute(cfg, Options{RandomFully: true}, nodes, "n1")); err != nil {
							b.Fatal(err)
						}
						removeMs = append(removeMs, ms(time.Since(start)))
					}
				}
				b.StopTimer()
				b.ReportMetric(percentile(configMs, 50), "config-p50-ms")
				b.ReportMetric(percentile(configMs, 99), "config-p99-ms")
				b.ReportMetric(percentile(nodeMs, 50), "node-p50-ms")
				b.ReportMetric(percentile(nodeMs, 99), "node-p99-ms")
				b.ReportMetric(percentile(removeMs, 50), "remove-p50-ms")
				b.ReportMetric(percentile(removeMs, 99), "remove-p99-ms")
				if err := be.Cleanup(ctx); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func percentile(xs []float64, p int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[min(i, len(s)-1)]
}
