// Package conntrack deletes connection-tracking entries that match a filter, over an
// nfnetlink socket that stays open.
//
// The kernel filters and deletes the entries itself where it takes CTA_FILTER on a flush (a
// 2024 addition; 6.18 here does): that walk skips the hash table's empty buckets without taking their
// locks, about 0.3 ms for the host's 262,144 buckets, where a dump takes each bucket's lock and
// costs about 10 ms however few entries the network namespace has. Older kernels refuse the
// filter, and Delete then dumps the table once for both families and deletes what matches.
//
// Why not github.com/vishvananda/netlink: its filtered delete dumps one family per call, and
// it closes its socket after every call, which waits out an RCU grace period when an nftables
// change deleted something just before (see nftnl.Conn), as a CNI DEL always has.
package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
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

// covers reports whether m selects entries of family.
func (m Match) covers(family uint8) bool {
	switch family {
	case unix.AF_INET:
		return m.IPv4 && (!m.Dst.IsValid() || m.Dst.Is4())
	case unix.AF_INET6:
		return m.IPv6 && (!m.Dst.IsValid() || m.Dst.Is6())
	}
	return false
}

func (e entry) matches(m Match) bool {
	return e.proto == m.Protocol && e.dstPort == m.DstPort && m.covers(e.family) &&
		(!m.Dst.IsValid() || m.Dst == e.dst)
}

// Delete removes every entry of the conntrack table that matches any of matches. An entry
// that disappears on its own meanwhile is not an error.
func Delete(sock *nftnl.Raw, matches []Match) error {
	if len(matches) == 0 {
		return nil
	}
	if err := flush(sock, matches); err == nil {
		return nil
	}
	// Any refusal means the kernel does not take the filter (EOPNOTSUPP, or EINVAL before
	// Linux 5.8, which reads the request as one incomplete tuple): nothing was deleted.
	_, err := deleteByDump(sock, matches)
	return err
}

// flush asks the kernel to delete the matching entries, one filtered flush per match and family.
func flush(sock *nftnl.Raw, matches []Match) error {
	var reqs [][]byte
	for _, m := range matches {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			if m.covers(family) {
				reqs = append(reqs, flushRequest(m, family))
			}
		}
	}
	errs, err := sock.Requests(netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgDelete), reqs)
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

func flushRequest(m Match, family uint8) []byte {
	flags := uint32(filterProtoNum | filterProtoDstPort)
	if m.Dst.IsValid() {
		flags |= filterIPDst
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctaTupleOrig, func(t *netlink.AttributeEncoder) error {
		if m.Dst.IsValid() {
			typ := uint16(ctaIPv4Dst)
			if m.Dst.Is6() {
				typ = ctaIPv6Dst
			}
			t.Nested(ctaTupleIP, func(ip *netlink.AttributeEncoder) error {
				ip.Bytes(typ, m.Dst.AsSlice())
				return nil
			})
		}
		t.Nested(ctaTupleProto, func(p *netlink.AttributeEncoder) error {
			p.Uint8(ctaProtoNum, m.Protocol)
			p.Bytes(ctaProtoDstPort, binary.BigEndian.AppendUint16(nil, m.DstPort))
			return nil
		})
		return nil
	})
	// The flags are in host byte order, unlike the tuple.
	ae.Nested(ctaFilter, func(f *netlink.AttributeEncoder) error {
		f.Uint32(ctaFilterOrigFlags, flags)
		f.Uint32(ctaFilterReplyFlags, 0)
		return nil
	})
	attrs, _ := ae.Encode() // the attributes are fixed-size values that always encode
	return append(nfgenmsg(family), attrs...)
}

// deleteByDump dumps the table once for both families, deletes each matching entry by its
// tuple, and returns how many it removed.
func deleteByDump(sock *nftnl.Raw, matches []Match) (int, error) {
	entries, err := dump(sock)
	if err != nil {
		return 0, err
	}
	var dels [][]byte
	for _, e := range entries {
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
	return carriedOut(errs, "deleting")
}

// carriedOut counts the requests of one batch the kernel carried out; an entry that went away
// meanwhile (ENOENT) is neither counted nor a failure.
func carriedOut(errs []error, doing string) (int, error) {
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
		return n, fmt.Errorf("conntrack: %s %d entries: %w", doing, len(failed), errors.Join(failed...))
	}
	return n, nil
}

// dump lists the entries of both families.
func dump(sock *nftnl.Raw) ([]entry, error) {
	// AF_UNSPEC: both families in one walk.
	msgs, err := sock.Dump(netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgGet), nfgenmsg(unix.AF_UNSPEC))
	if err != nil {
		return nil, fmt.Errorf("conntrack: listing entries: %w", err)
	}
	entries := make([]entry, 0, len(msgs))
	for _, data := range msgs {
		e, err := parseEntry(data)
		if err != nil {
			return nil, fmt.Errorf("conntrack: %w", err)
		}
		entries = append(entries, e)
	}
	return entries, nil
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
	ctaFilter       = 25

	ctaFilterOrigFlags  = 1
	ctaFilterReplyFlags = 2

	// Which fields of the filter's tuple count (CTA_FILTER_F_* of net/netfilter/nf_internals.h).
	filterIPDst        = 1 << 1
	filterProtoNum     = 1 << 3
	filterProtoDstPort = 1 << 5
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
