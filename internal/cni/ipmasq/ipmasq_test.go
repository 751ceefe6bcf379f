package ipmasq

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/netwarden/netwarden/internal/cni"
)

func TestDesiredDualStack(t *testing.T) {
	att := cni.Attachment{Network: "n", IfName: "eth0", ContainerID: "c"}
	ips := []netip.Prefix{netip.MustParsePrefix("10.88.0.2/24"), netip.MustParsePrefix("fd00:88::2/64")}

	nft := Desired(att, ips, "nftables")
	if len(nft.Chains) != 1 {
		t.Fatalf("nftables: want both families in one chain (one transaction), got %d chains", len(nft.Chains))
	}
	wantRules := []string{"ip daddr 10.88.0.0/24 return", "ip daddr 224.0.0.0/4 return",
		"ip6 daddr fd00:88::/64 return", "ip6 daddr ff00::/8 return", "masquerade"}
	if c := nft.Chains[0]; !slices.Equal(c.Rules, wantRules) || !slices.Equal(c.Jumps, []string{"ip saddr 10.88.0.2", "ip6 saddr fd00:88::2"}) {
		t.Errorf("nftables chain: jumps %q rules %q", c.Jumps, c.Rules)
	}

	ipt := Desired(att, ips, "iptables")
	if len(ipt.Chains) != 2 || ipt.Chains[0].Family != "ipv4" || ipt.Chains[1].Family != "ipv6" {
		t.Fatalf("iptables: want one chain per family, got %+v", ipt.Chains)
	}
	if c := ipt.Chains[1]; !slices.Equal(c.Rules, []string{"-d fd00:88::/64 -j RETURN", "-d ff00::/8 -j RETURN", "-j MASQUERADE"}) ||
		!slices.Equal(c.Jumps, []string{"-s fd00:88::2/128"}) {
		t.Errorf("ip6tables chain: jumps %q rules %q", c.Jumps, c.Rules)
	}
	if d := Desired(att, nil, "nftables"); len(d.Chains) != 0 {
		t.Errorf("no IPs: want no chains, got %+v", d.Chains)
	}
}
