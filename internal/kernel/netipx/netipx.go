// Package netipx holds what net/netip lacks and several packages need: the last address of a
// prefix.
package netipx

import "net/netip"

// LastAddr is the highest address of p: its masked address with every host bit set.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
