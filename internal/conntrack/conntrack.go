// Package conntrack deletes connection-tracking entries that match a filter, walking the
// table once for both address families, over an nfnetlink socket that stays open.
//
// Why not github.com/vishvananda/netlink: its filtered delete dumps one family per call, and a
// dump walks the whole host's conntrack hash (262,144 buckets here, about 3 ms) however few
// entries the network namespace has; and it closes its socket after every call, which waits
// out an RCU grace period when an nftables change deleted something just before (see
// nftnl.Conn), as a CNI DEL always has.
package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/nftnl"
)

// Match selects entries by their original direction: the protocol, the destination port and,
// when Dst is valid, the destination address. Families limits the match to IPv4 entries, IPv6
// entries or both.
type Match struct {
	Protocol uint8
	DstPort  uint16
	Dst      netip.Addr
	IPv4     bool
	IPv6     bool
}

// entry is the part of a dumped conntrack entry that matching and deleting need.
type entry struct {
	family  uint8
	proto   uint8
	dstPort uint16
	dst     netip.Addr
	// orig and zone are the raw CTA_TUPLE_ORIG and CTA_ZONE attributes, sent back to delete
	// exactly this entry.
	orig, zone []byte
	hasZone    bool
}

func (e entry) matches(m Match) bool {
	if e.proto != m.Protocol || e.dstPort != m.DstPort {
		return false
	}
	if (e.family == unix.AF_INET && !m.IPv4) || (e.family == unix.AF_INET6 && !m.IPv6) {
		return false
	}
	return !m.Dst.IsValid() || m.Dst == e.dst
}

// Delete removes every entry of the conntrack table that matches any of matches, with one
// walk of the table, and returns how many it removed. An entry that disappears on its own
// meanwhile is not an error.
func Delete(sock *nftnl.Raw, matches []Match) (int, error) {
	if len(matches) == 0 {
		return 0, nil
	}
	// AF_UNSPEC: both families in one walk.
	dump, err := sock.Dump(netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgGet), nfgenmsg(unix.AF_UNSPEC))
	if err != nil {
		return 0, fmt.Errorf("conntrack: listing entries: %w", err)
	}
	var dels [][]byte
	for _, data := range dump {
		e, err := parseEntry(data)
		if err != nil {
			return 0, fmt.Errorf("conntrack: %w", err)
		}
		for _, m := range matches {
			if e.matches(m) {
				dels = append(dels, deleteRequest(e))
				break
			}
		}
	}
	errs, err := sock.Requests(netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgDelete), dels)
	if err != nil {
		return 0, fmt.Errorf("conntrack: deleting entries: %w", err)
	}
	n := 0
	var failed []error
	for _, e := range errs {
		switch {
		case e == nil:
			n++
		case errors.Is(e, unix.ENOENT):
		default:
			failed = append(failed, e)
		}
	}
	if len(failed) > 0 {
		return n, fmt.Errorf("conntrack: deleting %d entries: %w", len(failed), errors.Join(failed...))
	}
	return n, nil
}

// ctnetlink message types and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctMsgGet    = 1
	ctMsgDelete = 2

	ctaTupleOrig    = 1
	ctaZone         = 18
	ctaTupleIP      = 1
	ctaTupleProto   = 2
	ctaIPv4Dst      = 2
	ctaIPv6Dst      = 4
	ctaProtoNum     = 1
	ctaProtoDstPort = 3
)

func nfgenmsg(family uint8) []byte { return []byte{family, unix.NFNETLINK_V0, 0, 0} }

func parseEntry(data []byte) (entry, error) {
	if len(data) < 4 {
		return entry{}, errors.New("short entry")
	}
	e := entry{family: data[0]}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return e, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			e.orig = ad.Bytes()
			ad.Nested(func(nad *netlink.AttributeDecoder) error { return parseTuple(nad, &e) })
		case ctaZone:
			e.zone, e.hasZone = ad.Bytes(), true
		}
	}
	return e, ad.Err()
}

func parseTuple(ad *netlink.AttributeDecoder, e *entry) error {
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(func(ip *netlink.AttributeDecoder) error {
				for ip.Next() {
					switch ip.Type() {
					case ctaIPv4Dst, ctaIPv6Dst:
						if a, ok := netip.AddrFromSlice(ip.Bytes()); ok {
							e.dst = a
						}
					}
				}
				return nil
			})
		case ctaTupleProto:
			ad.Nested(func(p *netlink.AttributeDecoder) error {
				p.ByteOrder = binary.BigEndian
				for p.Next() {
					switch p.Type() {
					case ctaProtoNum:
						e.proto = p.Uint8()
					case ctaProtoDstPort:
						e.dstPort = p.Uint16()
					}
				}
				return nil
			})
		}
	}
	return nil
}

func deleteRequest(e entry) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(ctaTupleOrig|unix.NLA_F_NESTED, e.orig)
	if e.hasZone {
		ae.Bytes(ctaZone, e.zone)
	}
	attrs, _ := ae.Encode() // encoding bytes attributes cannot fail
	return append(nfgenmsg(e.family), attrs...)
}
