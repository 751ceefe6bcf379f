package xtables

import (
	"context"
	"testing"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

// TestTablePresent checks the look that lets clean-up pass by tables that do not exist: a
// table shows up in its variant and family once a chain is made in it, and nowhere else.
func TestTablePresent(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		ctx := context.Background()
		for _, m := range []Mode{ModeNFT, ModeLegacy} {
			for _, fam := range Families {
				if TablePresent(m, fam, "mangle") {
					if m == ModeNFT {
						t.Errorf("fresh namespace: iptables-%s %s mangle present", m, fam)
					} else {
						// Kernels before on-demand tables make them with the namespace.
						t.Logf("fresh namespace: iptables-legacy %s mangle present already", fam)
					}
				}
			}
		}
		if _, err := (&Runner{Mode: ModeLegacy}).Run(ctx, IPv4, "-t", "mangle", "-N", "NW-TEST"); err != nil {
			t.Fatal(err)
		}
		if _, err := (&Runner{Mode: ModeNFT}).Run(ctx, IPv6, "-t", "nat", "-N", "NW-TEST"); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			mode  Mode
			fam   Family
			table string
			want  bool
		}{
			{ModeLegacy, IPv4, "mangle", true},
			{ModeNFT, IPv4, "mangle", false},
			{ModeNFT, IPv6, "nat", true},
			{ModeNFT, IPv4, "nat", false},
			{ModeNFT, IPv6, "mangle", false},
		} {
			if got := TablePresent(c.mode, c.fam, c.table); got != c.want {
				t.Errorf("iptables-%s %s %s present: %v, want %v", c.mode, c.fam, c.table, got, c.want)
			}
		}
		if !AnyTablePresent(ModeNFT, "nat") || AnyTablePresent(ModeNFT, "filter") {
			t.Error("AnyTablePresent does not follow the families")
		}
	}, "iptables-legacy", "ip6tables-nft")
}
