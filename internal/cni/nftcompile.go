package cni

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nftexpr"
)

// compileRule turns a rule of the small nft dialect the plugins render into netlink
// expressions, encoded as nft itself encodes that text (so that `nft list` prints the rule back
// as written, which CHECK relies on). It reports false for anything outside the dialect, such
// as user-supplied conditions; the caller then applies the transaction through nft instead.
//
// The dialect: "meta nfproto ipv4|ipv6", "ip|ip6 saddr|daddr ADDR[/LEN]",
// "tcp|udp|sctp dport PORT", "dnat ip to A:P", "dnat ip6 to [A]:P", "masquerade", "return",
// "jump CHAIN".
func compileRule(rule string) ([]expr.Any, bool) {
	tok := strings.Fields(rule)
	var out []expr.Any
	family := byte(0)
	needFamily := func(f byte) bool {
		if family == 0 {
			out = append(out, nftexpr.Family(f == unix.NFPROTO_IPV6)...)
			family = f
		}
		return family == f
	}
	for i := 0; i < len(tok); {
		rest := len(tok) - i
		switch t := tok[i]; {
		case t == "meta" && rest >= 3 && tok[i+1] == "nfproto":
			f := map[string]byte{"ipv4": unix.NFPROTO_IPV4, "ipv6": unix.NFPROTO_IPV6}[tok[i+2]]
			if f == 0 || family != 0 {
				return nil, false
			}
			needFamily(f)
			i += 3
		case (t == "ip" || t == "ip6") && rest >= 3 && (tok[i+1] == "saddr" || tok[i+1] == "daddr"):
			m, ok := addrMatch(t == "ip6", tok[i+1] == "saddr", tok[i+2])
			if !ok || !needFamily(map[bool]byte{false: unix.NFPROTO_IPV4, true: unix.NFPROTO_IPV6}[t == "ip6"]) {
				return nil, false
			}
			out = append(out, m...)
			i += 3
		case (t == "tcp" || t == "udp" || t == "sctp") && rest >= 3 && tok[i+1] == "dport":
			port, err := strconv.ParseUint(tok[i+2], 10, 16)
			if err != nil {
				return nil, false
			}
			proto := map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[t]
			out = append(out, nftexpr.L4Proto(proto)...)
			out = append(out, nftexpr.DPort(uint16(port))...)
			i += 3
		case t == "dnat" && rest == 4 && tok[i+2] == "to":
			v6 := tok[i+1] == "ip6"
			if !v6 && tok[i+1] != "ip" {
				return nil, false
			}
			ap, err := netip.ParseAddrPort(tok[i+3])
			if err != nil || ap.Addr().Is6() != v6 {
				return nil, false
			}
			fam := uint32(unix.NFPROTO_IPV4)
			if v6 {
				fam = unix.NFPROTO_IPV6
			}
			out = append(out, &expr.Immediate{Register: 1, Data: ap.Addr().AsSlice()},
				&expr.Immediate{Register: 2, Data: nftexpr.BE16(ap.Port())},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
			i += 4
		case t == "masquerade" && rest == 1:
			out = append(out, &expr.Masq{})
			i++
		case t == "return" && rest == 1:
			out = append(out, &expr.Verdict{Kind: expr.VerdictReturn})
			i++
		case t == "jump" && rest == 2:
			out = append(out, &expr.Verdict{Kind: expr.VerdictJump, Chain: tok[i+1]})
			i += 2
		default:
			return nil, false
		}
	}
	return out, true
}

// addrMatch parses an address or prefix of the given family for nftexpr.Addr.
func addrMatch(v6, src bool, s string) ([]expr.Any, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, false
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is6() != v6 {
		return nil, false
	}
	return nftexpr.Addr(p, src)
}
