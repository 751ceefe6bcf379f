package cni_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/cni"
	"github.com/netwarden/netwarden/internal/cni/ipmasq"
	"github.com/netwarden/netwarden/internal/cni/portmap"
)

const (
	benchExisting = 1000 // mappings on the node while ADD and DEL are measured
	benchRounds   = 100
)

// BenchmarkPortmapAddDel measures what a runtime waits for: one netwarden-portmap ADD and one
// DEL (process start, lock, transaction, conntrack flush of the UDP port) on a node that already
// holds 1,000 host-port mappings, as p50 and p99 per backend.
func BenchmarkPortmapAddDel(b *testing.B) { benchAddDel(b, "netwarden-portmap") }

// BenchmarkIPMasqAddDel is the same for netwarden-ipmasq with 1,000 masqueraded attachments.
func BenchmarkIPMasqAddDel(b *testing.B) { benchAddDel(b, "netwarden-ipmasq") }

func benchAddDel(b *testing.B, plugin string) {
	requireKernel(b)
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			n := newBareNode(b, backend)
			prefill(b, n, plugin, backend)
			// Each round measures an ADD and a DEL twice: back to back (each ADD starts as the DEL
			// before it exits), and on a quiet node, where each invocation starts about one RCU
			// grace period after the one before ended. They differ because a DEL's commit leaves
			// the kernel work to free what it deleted after a grace period, and the release of
			// the DEL's nfnetlink socket waits for that work while holding the nf_tables commit
			// mutex (nft_rcv_nl_event, unconditionally since Linux commit 9f6958ba2e90); the next
			// commit in the namespace waits behind it. The two kinds alternate within a round, so
			// a drift of the machine's speed reaches both alike.
			var add, del, quietAdd, quietDel []time.Duration
			for range b.N {
				add, del, quietAdd, quietDel = nil, nil, nil, nil
				for i := range benchRounds {
					conf := pluginConf(plugin, backend, fmt.Sprintf("10.98.%d.%d", i/200, i%200+1),
						[]portMapping{{HostPort: 40000 + i, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 40000 + i, ContainerPort: 80, Protocol: "udp"}}, nil)
					id := fmt.Sprintf("bench-%d", i)
					run := func(verb string, quiet bool) time.Duration {
						if quiet {
							waitGracePeriod(b)
						}
						start := time.Now()
						if _, err := n.execPlugin(plugin, verb, id, conf); err != nil {
							b.Fatalf("%s: %v", verb, err)
						}
						return time.Since(start)
					}
					add = append(add, run("ADD", false))
					del = append(del, run("DEL", false))
					quietAdd = append(quietAdd, run("ADD", true))
					quietDel = append(quietDel, run("DEL", true))
				}
			}
			want := benchExisting
			if plugin == "netwarden-portmap" {
				want *= 2 // DNAT and SNAT chains
			}
			if got := len(n.attChains()); got != want {
				b.Fatalf("%d attachment chains after the rounds, want %d", got, want)
			}
			b.ReportMetric(pct(add, 50), "add-p50-ms")
			b.ReportMetric(pct(add, 99), "add-p99-ms")
			b.ReportMetric(pct(del, 50), "del-p50-ms")
			b.ReportMetric(pct(del, 99), "del-p99-ms")
			b.ReportMetric(pct(quietAdd, 50), "quiet-add-p50-ms")
			b.ReportMetric(pct(quietAdd, 99), "quiet-add-p99-ms")
			b.ReportMetric(pct(quietDel, 50), "quiet-del-p50-ms")
			b.ReportMetric(pct(quietDel, 99), "quiet-del-p99-ms")
		})
	}
}

// prefill installs benchExisting attachments (with one mapping each for portmap) through the
// plugin's own store (in process, to keep the setup short).
func prefill(b *testing.B, n *node, plugin, backend string) {
	b.Helper()
	err := n.inNode(func() error {
		ctx := context.Background()
		var store cni.Store
		var err error
		kind := "nftables"
		nftLayout, iptLayout := portmap.NFTLayout(), portmap.IPTLayout()
		if plugin == "netwarden-ipmasq" {
			nftLayout, iptLayout = ipmasq.Plugin{}.NFTLayout(), ipmasq.Plugin{}.IPTLayout()
		}
		if backend == "nftables" {
			store, err = cni.NewNFTStore(nftLayout)
		} else {
			kind = "iptables"
			store, err = cni.NewIPTStore(ctx, iptLayout, backend[len("iptables-"):])
		}
		if err != nil {
			return err
		}
		for i := range benchExisting {
			ip := netip.AddrFrom4([4]byte{10, 97, byte(i / 200), byte(i%200 + 1)})
			a := cni.Attachment{Network: network, IfName: "eth0", ContainerID: fmt.Sprintf("existing-%d", i)}
			ips := []netip.Prefix{netip.PrefixFrom(ip, 16)}
			cfg := portmap.Config{SNAT: true, Mappings: []portmap.Mapping{{HostPort: uint16(30000 + i), ContainerPort: 80, Protocol: "tcp"}}}
			d := portmap.Desired(a, cfg, ips, kind)
			if plugin == "netwarden-ipmasq" {
				d = ipmasq.Desired(a, ips, kind)
			}
			if err := store.Add(ctx, d); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatalf("prefill: %v", err)
	}
}

// waitGracePeriod returns when an RCU grace period that began now has ended, by which time the
// grace period of the kernel's deferred work from the invocations before (nf_tables frees what
// a commit deleted one grace period after it) has ended too, and that work is done or about to
// be: membarrier(MEMBARRIER_CMD_GLOBAL) is synchronize_rcu() on a machine with more than one
// CPU. With one CPU it returns at once, and the quiet figures are back-to-back ones.
func waitGracePeriod(b *testing.B) {
	b.Helper()
	const membarrierCmdGlobal = 1 // MEMBARRIER_CMD_GLOBAL in linux/membarrier.h; x/sys/unix lacks it
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdGlobal, 0, 0); errno != 0 {
		b.Fatalf("membarrier(MEMBARRIER_CMD_GLOBAL): %v", errno)
	}
}

func pct(ds []time.Duration, p int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return float64(s[i].Microseconds()) / 1000
}
