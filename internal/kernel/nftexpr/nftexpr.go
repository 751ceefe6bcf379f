// Package nftexpr encodes rule matches into kernel expressions exactly as nft encodes the same
// text, so that a rule sent over netlink lists (and compares) like one sent through nft. The
// NetworkPolicy backend's rules and the CNI plugins' rules are both built from these pieces.
package nftexpr

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Registers as nft uses them: a 16-byte register for single values; for a concatenation each
// part starts in the next 4-byte register.
const (
	Reg1     = unix.NFT_REG_1
	Reg32_00 = unix.NFT_REG32_00
)

// Family is "meta nfproto ipv4|ipv6".
func Family(v6 bool) []expr.Any {
	fam := byte(unix.NFPROTO_IPV4)
	if v6 {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: Reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: []byte{fam}},
	}
}

// L4Proto is "meta l4proto P", which nft emits ahead of a port match.
func L4Proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: Reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: []byte{proto}},
	}
}

// LoadAddr loads the source or destination address of the network header into dreg.
func LoadAddr(v6, src bool, dreg uint32) expr.Any {
	off, l := uint32(16), uint32(4)
	switch {
	case v6 && src:
		off, l = 8, 16
	case v6:
		off, l = 24, 16
	case src:
		off = 12
	}
	return &expr.Payload{DestRegister: dreg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l}
}

// LoadDPort loads the transport header's destination port into dreg.
func LoadDPort(dreg uint32) expr.Any {
	return &expr.Payload{DestRegister: dreg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// DPort is "dport P" after L4Proto.
func DPort(port uint16) []expr.Any {
	return []expr.Any{LoadDPort(Reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: BE16(port)}}
}

// DPortRange is "dport A-B" after L4Proto; nft (in its version here) encodes it as two
// comparisons, not a range expression.
func DPortRange(first, last uint16) []expr.Any {
	return []expr.Any{
		LoadDPort(Reg1),
		&expr.Cmp{Op: expr.CmpOpGte, Register: Reg1, Data: BE16(first)},
		&expr.Cmp{Op: expr.CmpOpLte, Register: Reg1, Data: BE16(last)},
	}
}

// Addr is "ip|ip6 saddr|daddr P" for a masked prefix: whole bytes are compared directly, an
// IPv4 prefix ending inside a byte is masked first. It reports false for what it does not
// encode (an unmasked prefix, an IPv6 prefix ending inside a byte).
func Addr(p netip.Prefix, src bool) ([]expr.Any, bool) {
	v6 := p.Addr().Is6()
	if p != p.Masked() {
		return nil, false
	}
	load := LoadAddr(v6, src, Reg1).(*expr.Payload)
	addr := p.Addr().AsSlice()
	if p.Bits()%8 == 0 {
		n := uint32(p.Bits() / 8)
		load.Len = n
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: addr[:n]}}, true
	}
	if v6 {
		return nil, false
	}
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	return []expr.Any{
		load,
		&expr.Bitwise{SourceRegister: Reg1, DestRegister: Reg1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: addr},
	}, true
}

// BE16 is a port or other 16-bit value in network order.
func BE16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
