// Package ipmasq computes the rules of the netwarden-ipmasq CNI plugin: traffic from an
// attachment's IPs to anything outside the attachment's subnets (multicast excepted) leaves
// masqueraded, every IP of the attachment in one transaction.
package ipmasq

import (
	"net/netip"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/cni"
)

// Table is the nftables table of the plugin.
const Table = "netwarden-ipmasq"

const (
	nftGroup = "mq"
	iptGroup = "NWMQ"
)

var (
	multicast4 = netip.MustParsePrefix("224.0.0.0/4")
	multicast6 = netip.MustParsePrefix("ff00::/8")
)

// Plugin is netwarden-ipmasq.
type Plugin struct{}

func (Plugin) Name() string { return "netwarden-ipmasq" }

func (Plugin) NFTLayout() cni.NFTLayout {
	return cni.NFTLayout{
		Table:  Table,
		Groups: []string{nftGroup},
		Base: []cni.NFTBaseChain{{Name: "postrouting", Type: knftables.NATType, Hook: knftables.PostroutingHook,
			Priority: knftables.SNATPriority, Rules: []string{"jump " + nftGroup + "-dispatch"}}},
	}
}

func (Plugin) IPTLayout() cni.IPTLayout {
	return cni.IPTLayout{
		Table:  "nat",
		Groups: []string{iptGroup},
		Hooks:  []cni.IPTHook{{Chain: "POSTROUTING", Rule: "-j " + iptGroup + "-dispatch"}},
	}
}

func (Plugin) Desired(inv *cni.Invocation, kind string) (cni.Desired, error) {
	if inv.Result == nil {
		return cni.Desired{}, cni.ConfigError("prevResult", "missing")
	}
	// An attachment without IPs has nothing to masquerade, and gets no rules.
	return Desired(inv.Att, cni.ContainerIPs(inv.Result), kind), nil
}

// Desired returns the attachment's chains: each container IP jumps to them, they return for
// the container's own subnets and multicast and masquerade the rest.
func Desired(att cni.Attachment, ips []netip.Prefix, kind string) cni.Desired {
	d := cni.Desired{Att: att}
	for _, v6 := range []bool{false, true} {
		var jumps, rules []string
		seen := map[netip.Prefix]bool{}
		for _, p := range ips {
			if p.Addr().Is6() != v6 {
				continue
			}
			host := netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
			if kind == "iptables" {
				jumps = append(jumps, "-s "+host.String())
			} else {
				jumps = append(jumps, family(v6)+" saddr "+p.Addr().String())
			}
			if s := p.Masked(); !seen[s] {
				seen[s] = true
				rules = append(rules, ret(kind, v6, s))
			}
		}
		if len(jumps) == 0 {
			continue
		}
		mc := multicast4
		if v6 {
			mc = multicast6
		}
		rules = append(rules, ret(kind, v6, mc))
		if kind == "iptables" {
			fam := "ipv4"
			if v6 {
				fam = "ipv6"
			}
			d.Chains = append(d.Chains, cni.Chain{Group: iptGroup, Family: fam, Jumps: jumps, Rules: append(rules, "-j MASQUERADE")})
			continue
		}
		if len(d.Chains) == 0 {
			d.Chains = append(d.Chains, cni.Chain{Group: nftGroup})
		}
		d.Chains[0].Jumps = append(d.Chains[0].Jumps, jumps...)
		d.Chains[0].Rules = append(d.Chains[0].Rules, rules...)
	}
	if kind != "iptables" && len(d.Chains) > 0 {
		d.Chains[0].Rules = append(d.Chains[0].Rules, "masquerade")
	}
	return d
}

func family(v6 bool) string {
	if v6 {
		return "ip6"
	}
	return "ip"
}

func ret(kind string, v6 bool, p netip.Prefix) string {
	if kind == "iptables" {
		return "-d " + p.String() + " -j RETURN"
	}
	return family(v6) + " daddr " + p.String() + " return"
}

func (Plugin) AfterAdd(*cni.Invocation, *cni.Desired) error { return nil }
func (Plugin) AfterDel(*cni.Invocation, *cni.Desired) error { return nil }
