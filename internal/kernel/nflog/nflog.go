// Package nflog reads packets that the kernel logs to an NFLOG group (nft `log group N`,
// iptables -j NFLOG) over netfilter netlink, the nfnetlink_log protocol, which is all the
// drop logging needs: it binds one group, asks for the first bytes of each packet, and parses
// the addresses, protocol and ports from them.
//
// Binding is per network namespace: the socket hears the packets logged in the namespace of
// the process that opens it, and the kernel lets one socket bind a group at a time.
package nflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nfsubsys"
)

// From include/uapi/linux/netfilter/nfnetlink_log.h and nfnetlink.h.
const (
	subsysULOG = 4

	msgPacket = 0
	msgConfig = 1

	attrPacketHdr = 1
	attrPayload   = 9
	attrPrefix    = 10

	cfgAttrCmd     = 1
	cfgAttrMode    = 2
	cfgAttrNLBuf   = 3
	cfgAttrTimeout = 4
	cfgAttrQThresh = 5

	cmdBind     = 1
	cmdPFBind   = 3
	cmdPFUnbind = 4

	copyPacket = 2
)

// copyRange is how much of each packet the kernel copies: enough for an IPv4 header with
// options or an IPv6 header, and the ports after it.
const copyRange = 96

// Packet is one logged packet.
type Packet struct {
	Prefix   string
	Src, Dst netip.Addr
	Proto    uint8 // IPPROTO_*
	// SrcPort and DstPort are set for TCP, UDP and SCTP.
	SrcPort, DstPort uint16
}

// Conn is a socket bound to one NFLOG group.
type Conn struct {
	c     *nfsubsys.Conn
	group uint16
}

// Open binds NFLOG group in the caller's network namespace.
func Open(group uint16) (*Conn, error) {
	c, err := nfsubsys.Dial(subsysULOG)
	if err != nil {
		return nil, fmt.Errorf("nflog: netlink socket: %w", err)
	}
	l := &Conn{c: c, group: group}
	// PF_UNBIND and PF_BIND were needed before Linux 3.17 to attach nfnetlink_log as the
	// logger of a family; later kernels ignore them, so their errors do not matter.
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		_ = l.config(fam, 0, cmdPFUnbind, nil)
		_ = l.config(fam, 0, cmdPFBind, nil)
	}
	if err := l.config(unix.AF_UNSPEC, group, cmdBind, nil); err != nil {
		c.Close()
		// The kernel answers EPERM when another socket holds the group.
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("nflog: group %d is bound by another process in this network namespace (one reader per group): %w", group, err)
		}
		return nil, fmt.Errorf("nflog: binding group %d: %w", group, err)
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode[0:4], copyRange)
	mode[4] = copyPacket
	// A threshold of one packet and no timeout: each message is sent as its packet is logged,
	// which the kernel rate limit keeps cheap.
	attrs := []netlink.Attribute{
		{Type: cfgAttrMode, Data: mode},
		{Type: cfgAttrQThresh, Data: nfsubsys.BE32(1)},
		{Type: cfgAttrTimeout, Data: nfsubsys.BE32(0)},
		{Type: cfgAttrNLBuf, Data: nfsubsys.BE32(16384)},
	}
	if err := l.config(unix.AF_UNSPEC, group, 0, attrs); err != nil {
		l.Close()
		return nil, fmt.Errorf("nflog: configuring group %d: %w", group, err)
	}
	// Room for bursts: a full buffer loses messages (ENOBUFS), which Receive reports.
	_ = c.SetReadBuffer(1 << 20)
	return l, nil
}

// config sends an NFULNL_MSG_CONFIG request: a command (when cmd is not 0) and attrs.
func (l *Conn) config(family uint8, resID uint16, cmd uint8, attrs []netlink.Attribute) error {
	if cmd != 0 {
		attrs = append([]netlink.Attribute{{Type: cfgAttrCmd, Data: []byte{cmd}}}, attrs...)
	}
	return l.c.Request(msgConfig, family, resID, attrs)
}

// Close closes the socket, which unbinds the group: the kernel drops a socket's instances
// when it is released. It returns a Receive blocked at the time. An explicit UNBIND would have
// to wait for that Receive, which holds the connection.
func (l *Conn) Close() error { return l.c.Close() }

// SetReadDeadline makes a blocked Receive return at t, to stop a reader.
func (l *Conn) SetReadDeadline(t time.Time) error { return l.c.SetReadDeadline(t) }

// ErrLost is returned (wrapped) by Receive when the socket's buffer overflowed and the kernel
// dropped messages; reading may go on.
var ErrLost = nfsubsys.ErrLost

// Receive waits for logged packets. Messages it cannot parse are skipped.
func (l *Conn) Receive() ([]Packet, error) {
	bodies, err := l.c.Receive(msgPacket)
	if err != nil {
		return nil, err
	}
	var out []Packet
	for _, b := range bodies {
		if p, ok := parsePacket(b); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// parsePacket reads the attributes of an NFULNL_MSG_PACKET after its nfgenmsg header.
func parsePacket(b []byte) (Packet, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return Packet{}, false
	}
	var p Packet
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case attrPrefix:
			p.Prefix = ad.String()
		case attrPayload:
			payload = ad.Bytes()
		case attrPacketHdr:
		}
	}
	if ad.Err() != nil || payload == nil {
		return Packet{}, false
	}
	return p, ParseIP(payload, &p)
}

// ParseIP fills in addresses, protocol and ports from an IPv4 or IPv6 packet's first bytes.
// IPv6 extension headers are not followed; such a packet gets no ports.
func ParseIP(b []byte, p *Packet) bool {
	if len(b) < 1 {
		return false
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 {
			return false
		}
		p.Src = netip.AddrFrom4([4]byte(b[12:16]))
		p.Dst = netip.AddrFrom4([4]byte(b[16:20]))
		p.Proto = b[9]
		// Only the first fragment carries the ports.
		if binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 && len(b) >= ihl {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return false
		}
		p.Src = netip.AddrFrom16([16]byte(b[8:24]))
		p.Dst = netip.AddrFrom16([16]byte(b[24:40]))
		p.Proto = b[6]
		l4 = b[40:]
	default:
		return false
	}
	switch p.Proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(l4) >= 4 {
			p.SrcPort = binary.BigEndian.Uint16(l4[0:2])
			p.DstPort = binary.BigEndian.Uint16(l4[2:4])
		}
	}
	return true
}

// ProtoName spells an IP protocol number as NetworkPolicy does, or as a number.
func ProtoName(proto uint8) string {
	switch proto {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return fmt.Sprint(proto)
}
