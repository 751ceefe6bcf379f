package cni

import "testing"

// The rules the plugins render must take the netlink path (an nft process per ADD costs more
// than the rest of the ADD); only user conditions may fall back to nft. That the encoding lists
// back as the same text is proven by the CHECK kernel tests in test/cni.
func TestCompileRule(t *testing.T) {
	for _, r := range []string{
		"ip daddr 127.0.0.0/8 return",
		"ip6 daddr ::1 return",
		"meta nfproto ipv4 tcp dport 8080 dnat ip to 10.88.0.2:80",
		"meta nfproto ipv6 udp dport 8080 dnat ip6 to [fd00:88::2]:80",
		"ip daddr 198.51.100.1 sctp dport 9090 dnat ip to 10.88.0.2:90",
		"ip6 daddr 2001:db8::1 tcp dport 9090 dnat ip6 to [fd00:88::2]:90",
		"ip saddr 10.88.0.2 ip daddr 10.88.0.2 tcp dport 80 masquerade",
		"ip saddr 127.0.0.0/8 ip daddr 10.88.0.2 tcp dport 80 masquerade",
		"ip6 daddr fd00:88::2 udp dport 53 masquerade",
		"ip daddr 10.88.0.0/24 return",
		"ip daddr 224.0.0.0/4 return",
		"ip6 daddr fd00:88::/64 return",
		"ip6 daddr ff00::/8 return",
		"masquerade",
		"jump pm-0123abcd-0123456789ab",
		"ip saddr 10.88.0.2 jump mq-0123abcd-0123456789ab",
	} {
		if _, ok := compileRule(r); !ok {
			t.Errorf("%q does not compile to netlink", r)
		}
	}
	for _, r := range []string{
		"ip saddr != 192.0.2.0/24 tcp dport 80 dnat ip to 10.0.0.1:80", // user condition
		"ip6 daddr fd00::/62 return",                                   // left to nft
		"ip daddr 10.0.0.1/24 return",                                  // not a network address
		"ip daddr fd00::1 return",                                      // wrong family
		"ip daddr 10.0.0.1 ip6 saddr fd00::1 return",                   // two families
		"tcp dport 70000 return",
		"dnat ip to [fd00::1]:80",
	} {
		if _, ok := compileRule(r); ok {
			t.Errorf("%q compiled, want the nft fallback", r)
		}
	}
}
