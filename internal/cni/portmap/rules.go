package portmap

import (
	"fmt"
	"net/netip"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/cni"
)

// Table is the nftables table of the plugin.
const Table = "netwarden-portmap"

// Groups: DNAT chains entered from prerouting and output, SNAT chains from postrouting.
const (
	nftDNAT = "pm"
	nftSNAT = "ps"
	iptDNAT = "NWPM"
	iptSNAT = "NWPS"
)

// NFTLayout is the plugin's inet table.
func NFTLayout() cni.NFTLayout {
	local := "fib daddr type local jump " + nftDNAT + "-dispatch"
	return cni.NFTLayout{
		Table:  Table,
		Groups: []string{nftDNAT, nftSNAT},
		Base: []cni.NFTBaseChain{
			{Name: "prerouting", Type: knftables.NATType, Hook: knftables.PreroutingHook, Priority: knftables.DNATPriority, Rules: []string{local}},
			{Name: "output", Type: knftables.NATType, Hook: knftables.OutputHook, Priority: knftables.DNATPriority, Rules: []string{local}},
			{Name: "postrouting", Type: knftables.NATType, Hook: knftables.PostroutingHook, Priority: knftables.SNATPriority,
				Rules: []string{"ct status dnat jump " + nftSNAT + "-dispatch"}},
		},
	}
}

// IPTLayout is the plugin's chains in the nat table.
func IPTLayout() cni.IPTLayout {
	local := "-m addrtype --dst-type LOCAL -j " + iptDNAT + "-dispatch"
	return cni.IPTLayout{
		Table:  "nat",
		Groups: []string{iptDNAT, iptSNAT},
		Hooks: []cni.IPTHook{
			{Chain: "PREROUTING", Rule: local},
			{Chain: "OUTPUT", Rule: local},
			{Chain: "POSTROUTING", Rule: "-m conntrack --ctstate DNAT -j " + iptSNAT + "-dispatch"},
		},
	}
}

// Desired returns the attachment's chains for kind ("nftables" or "iptables").
func Desired(att cni.Attachment, cfg Config, ips []netip.Prefix, kind string) cni.Desired {
	d := cni.Desired{Att: att}
	for _, v6 := range []bool{false, true} {
		var dnat, snat []string
		if !cfg.LocalhostHostPorts || v6 {
			dnat = append(dnat, loopbackReturn(kind, v6))
		}
		conds := cfg.ConditionsV4
		if v6 {
			conds = cfg.ConditionsV6
		}
		n := 0
		for _, p := range ips {
			c := p.Addr()
			if c.Is6() != v6 {
				continue
			}
			for _, m := range cfg.Mappings {
				if m.HostIP.IsValid() && m.HostIP.Is6() != v6 {
					continue
				}
				n++
				dnat = append(dnat, dnatRule(kind, m, c, conds))
				if cfg.SNAT {
					snat = append(snat, snatRules(kind, m, c, cfg)...)
				}
			}
		}
		if n == 0 {
			continue
		}
		dnat, snat = dedupe(dnat), dedupe(snat)
		groupD, groupS, fam := nftDNAT, nftSNAT, ""
		if kind == "iptables" {
			groupD, groupS, fam = iptDNAT, iptSNAT, "ipv4"
			if v6 {
				fam = "ipv6"
			}
		} else if v6 && len(d.Chains) > 0 {
			// nftables keeps both families in one inet chain per group.
			d.Chains[0].Rules = append(d.Chains[0].Rules, dnat...)
			if len(snat) > 0 {
				if len(d.Chains) > 1 {
					d.Chains[1].Rules = append(d.Chains[1].Rules, snat...)
				} else {
					d.Chains = append(d.Chains, cni.Chain{Group: groupS, Jumps: []string{""}, Rules: snat})
				}
			}
			continue
		}
		d.Chains = append(d.Chains, cni.Chain{Group: groupD, Family: fam, Jumps: []string{""}, Rules: dnat})
		if len(snat) > 0 {
			d.Chains = append(d.Chains, cni.Chain{Group: groupS, Family: fam, Jumps: []string{""}, Rules: snat})
		}
	}
	return d
}

func dedupe(rules []string) []string {
	seen := map[string]bool{}
	out := rules[:0]
	for _, r := range rules {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

// loopbackReturn keeps loopback destinations away from the DNAT rules: IPv6 never supports them,
// IPv4 only with the opt-in.
func loopbackReturn(kind string, v6 bool) string {
	switch {
	case kind == "iptables" && v6:
		return "-d ::1/128 -j RETURN"
	case kind == "iptables":
		return "-d 127.0.0.0/8 -j RETURN"
	case v6:
		return "ip6 daddr ::1 return"
	}
	return "ip daddr 127.0.0.0/8 return"
}

func dnatRule(kind string, m Mapping, c netip.Addr, conds []string) string {
	to := fmt.Sprintf("%s:%d", c, m.ContainerPort)
	if c.Is6() {
		to = fmt.Sprintf("[%s]:%d", c, m.ContainerPort)
	}
	var parts []string
	if kind == "iptables" {
		if m.HostIP.IsValid() {
			parts = append(parts, "-d", hostPrefix(m.HostIP))
		}
		parts = append(parts, conds...)
		parts = append(parts, "-p", m.Protocol, "-m", m.Protocol, "--dport", fmt.Sprint(m.HostPort), "-j", "DNAT", "--to-destination", to)
		return strings.Join(parts, " ")
	}
	fam := "ip"
	if c.Is6() {
		fam = "ip6"
	}
	switch {
	case m.HostIP.IsValid():
		parts = append(parts, fam+" daddr "+m.HostIP.String())
	case len(conds) > 0 && strings.HasPrefix(conds[0], fam+" "):
		// The condition's own ip/ip6 match implies the family; nft lists the rule without the
		// meta match, and CHECK compares with that listing.
	case c.Is6():
		parts = append(parts, "meta nfproto ipv6")
	default:
		parts = append(parts, "meta nfproto ipv4")
	}
	parts = append(parts, conds...)
	parts = append(parts, fmt.Sprintf("%s dport %d dnat %s to %s", m.Protocol, m.HostPort, fam, to))
	return strings.Join(parts, " ")
}

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// snatRules masquerades DNATed traffic to the container that would otherwise not come back
// through the node: from the container itself (hairpin) and, when opted in, from localhost; with
// masqAll, every DNATed connection. The hook only enters these chains for DNATed connections.
func snatRules(kind string, m Mapping, c netip.Addr, cfg Config) []string {
	var sources []string
	switch {
	case cfg.MasqAll:
		sources = []string{""}
	default:
		sources = []string{hostPrefix(c)}
		if cfg.LocalhostHostPorts && c.Is4() {
			sources = append(sources, "127.0.0.0/8")
		}
	}
	var out []string
	for _, src := range sources {
		if kind == "iptables" {
			s := ""
			if src != "" {
				s = "-s " + src + " "
			}
			out = append(out, fmt.Sprintf("%s-d %s -p %s -m %s --dport %d -j MASQUERADE",
				s, hostPrefix(c), m.Protocol, m.Protocol, m.ContainerPort))
			continue
		}
		fam := "ip"
		if c.Is6() {
			fam = "ip6"
		}
		s := ""
		if src != "" {
			s = fam + " saddr " + strings.TrimSuffix(strings.TrimSuffix(src, "/32"), "/128") + " "
		}
		out = append(out, fmt.Sprintf("%s%s daddr %s %s dport %d masquerade", s, fam, c, m.Protocol, m.ContainerPort))
	}
	return out
}
