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

// Flow is one conntrack entry as a policy judges it: its original direction before and after
// NAT. A policy sees a connection after DNAT (a Service address is already its endpoint), so
// the judged destination is the reply tuple's source; SNAT happens after the judgement, so the
// judged source is the original one.
type Flow struct {
	Protocol uint8
	// Src, SrcPort, Dst and DstPort are the original tuple, as the first packet had them.
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	// ReplySrc and ReplySrcPort are where the reply comes from: the destination after DNAT.
	ReplySrc     netip.Addr
	ReplySrcPort uint16
	Mark         uint32

	family     uint8
	orig, zone []byte
	hasZone    bool
}

// Flows lists the entries of both families. ICMP entries carry no ports.
func Flows(sock *nftnl.Raw) ([]Flow, error) {
	msgs, err := sock.Dump(netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgGet), nfgenmsg(unix.AF_UNSPEC))
	if err != nil {
		return nil, fmt.Errorf("conntrack: listing entries: %w", err)
	}
	flows := make([]Flow, 0, len(msgs))
	for _, data := range msgs {
		f, err := parseFlow(data)
		if err != nil {
			return nil, fmt.Errorf("conntrack: %w", err)
		}
		flows = append(flows, f)
	}
	return flows, nil
}

// SetMarkBits sets (set true) or clears the bits of mask in the mark of each flow, leaving its
// other bits as they are. A flow that ended meanwhile is skipped; it returns how many it changed.
func SetMarkBits(sock *nftnl.Raw, flows []Flow, mask uint32, set bool) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	value := uint32(0)
	if set {
		value = mask
	}
	reqs := make([][]byte, len(flows))
	for i, f := range flows {
		ae := netlink.NewAttributeEncoder()
		ae.Bytes(ctaTupleOrig|unix.NLA_F_NESTED, f.orig)
		if f.hasZone {
			ae.Bytes(ctaZone, f.zone)
		}
		// The kernel computes (mark & ~MARK_MASK) ^ MARK.
		ae.Bytes(ctaMark, binary.BigEndian.AppendUint32(nil, value))
		ae.Bytes(ctaMarkMask, binary.BigEndian.AppendUint32(nil, mask))
		attrs, _ := ae.Encode() // bytes attributes always encode
		reqs[i] = append(nfgenmsg(f.family), attrs...)
	}
	// IPCTNL_MSG_CT_NEW without NLM_F_CREATE updates an entry and never makes one.
	errs, err := sock.Requests(netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgNew), reqs)
	if err != nil {
		return 0, fmt.Errorf("conntrack: marking entries: %w", err)
	}
	return carriedOut(errs, "marking")
}

const (
	ctMsgNew     = 0
	ctaTupleRepl = 2
	ctaMark      = 8
	ctaMarkMask  = 21
	ctaIPv4Src   = 1
	ctaIPv6Src   = 3
	ctaProtoSrc  = 2
)

// tuple is one direction of an entry.
type tuple struct {
	src, dst         netip.Addr
	srcPort, dstPort uint16
	proto            uint8
}

func parseFlow(data []byte) (Flow, error) {
	if len(data) < 4 {
		return Flow{}, errors.New("short entry")
	}
	f := Flow{family: data[0]}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return f, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			f.orig = ad.Bytes()
			var t tuple
			ad.Nested(func(nad *netlink.AttributeDecoder) error { parseFullTuple(nad, &t); return nil })
			f.Protocol, f.Src, f.Dst, f.SrcPort, f.DstPort = t.proto, t.src, t.dst, t.srcPort, t.dstPort
		case ctaTupleRepl:
			var t tuple
			ad.Nested(func(nad *netlink.AttributeDecoder) error { parseFullTuple(nad, &t); return nil })
			f.ReplySrc, f.ReplySrcPort = t.src, t.srcPort
		case ctaZone:
			f.zone, f.hasZone = ad.Bytes(), true
		case ctaMark:
			f.Mark = ad.Uint32()
		}
	}
	return f, ad.Err()
}

func parseFullTuple(ad *netlink.AttributeDecoder, t *tuple) {
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(func(ip *netlink.AttributeDecoder) error {
				for ip.Next() {
					a, ok := netip.AddrFromSlice(ip.Bytes())
					if !ok {
						continue
					}
					switch ip.Type() {
					case ctaIPv4Src, ctaIPv6Src:
						t.src = a
					case ctaIPv4Dst, ctaIPv6Dst:
						t.dst = a
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
						t.proto = p.Uint8()
					case ctaProtoSrc:
						t.srcPort = p.Uint16()
					case ctaProtoDstPort:
						t.dstPort = p.Uint16()
					}
				}
				return nil
			})
		}
	}
}
