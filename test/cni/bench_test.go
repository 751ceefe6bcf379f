package cni_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/cni"
	"github.com/netwarden/netwarden/internal/portmap"
)

const (
	benchExisting = 1000 // mappings on the node while ADD and DEL are measured
	benchRounds   = 100
)

// BenchmarkPortmapAddDel measures what a runtime waits for: one netwarden-portmap ADD and one
// DEL (process start, lock, backend detection, transaction) on a node that already holds 1,000
// host-port mappings, as p50 and p99 per backend.
func BenchmarkPortmapAddDel(b *testing.B) {
	requireKernel(b)
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			n := newBareNode(b, backend)
			prefill(b, n, backend)
			var add, del []time.Duration
			for range b.N {
				add, del = nil, nil
				for i := range benchRounds {
					conf := pluginConf("netwarden-portmap", backend, fmt.Sprintf("10.98.%d.%d", i/200, i%200+1),
						[]portMapping{{HostPort: 40000 + i, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 40000 + i, ContainerPort: 80, Protocol: "udp"}}, nil)
					id := fmt.Sprintf("bench-%d", i)
					start := time.Now()
					if _, err := n.execPlugin("netwarden-portmap", "ADD", id, conf); err != nil {
						b.Fatalf("ADD: %v", err)
					}
					add = append(add, time.Since(start))
					start = time.Now()
					if _, err := n.execPlugin("netwarden-portmap", "DEL", id, conf); err != nil {
						b.Fatalf("DEL: %v", err)
					}
					del = append(del, time.Since(start))
				}
			}
			if got := len(n.attChains()); got != 2*benchExisting {
				b.Fatalf("%d attachment chains after the rounds, want %d", got, 2*benchExisting)
			}
			b.ReportMetric(pct(add, 50), "add-p50-ms")
			b.ReportMetric(pct(add, 99), "add-p99-ms")
			b.ReportMetric(pct(del, 50), "del-p50-ms")
			b.ReportMetric(pct(del, 99), "del-p99-ms")
		})
	}
}

// prefill installs benchExisting attachments with one mapping each through the plugin's own
// store (in process, to keep the setup short).
func prefill(b *testing.B, n *node, backend string) {
	b.Helper()
	err := n.inNode(func() error {
		ctx := context.Background()
		var store cni.Store
		var err error
		kind := "nftables"
		if backend == "nftables" {
			store, err = cni.NewNFTStore(portmap.NFTLayout())
		} else {
			kind = "iptables"
			store, err = cni.NewIPTStore(ctx, portmap.IPTLayout(), backend[len("iptables-"):])
		}
		if err != nil {
			return err
		}
		for i := range benchExisting {
			ip := netip.AddrFrom4([4]byte{10, 97, byte(i / 200), byte(i%200 + 1)})
			cfg := portmap.Config{SNAT: true, Mappings: []portmap.Mapping{{HostPort: uint16(30000 + i), ContainerPort: 80, Protocol: "tcp"}}}
			d := portmap.Desired(cni.Attachment{Network: network, IfName: "eth0", ContainerID: fmt.Sprintf("existing-%d", i)},
				cfg, []netip.Prefix{netip.PrefixFrom(ip, 16)}, kind)
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

func pct(ds []time.Duration, p int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return float64(s[i].Microseconds()) / 1000
}
