// Package nfqueue holds packets that the kernel queues to userspace (iptables -j NFQUEUE, or
// the same target through nft_compat) over netfilter netlink, the nfnetlink_queue protocol,
// until a verdict releases or drops each: it binds one queue, asks for whole packets, and
// returns each with the id its verdict names.
//
// Binding is per network namespace: the socket holds the packets queued in the namespace of
// the process that opens it. A queue rule with the bypass flag lets packets through while no
// socket is bound, and the fail-open flag set here lets them through when the queue is full,
// so a reader that is gone or slow delays packets but never drops them.
package nfqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nfsubsys"
)

// From include/uapi/linux/netfilter/nfnetlink_queue.h and nfnetlink.h.
const (
	subsysQueue = 3

	msgPacket  = 0
	msgVerdict = 1
	msgConfig  = 2

	attrPacketHdr  = 1
	attrVerdictHdr = 2
	attrPayload    = 10

	cfgAttrCmd    = 1
	cfgAttrParams = 2
	cfgAttrMaxLen = 3
	cfgAttrMask   = 4
	cfgAttrFlags  = 5

	cmdBind     = 1
	cmdPFBind   = 3
	cmdPFUnbind = 4

	copyPacket = 2

	flagFailOpen = 0x01
	flagGSO      = 0x04

	// Verdicts (include/uapi/linux/netfilter.h).
	verdictDrop   = 0
	verdictAccept = 1
)

// copyRange asks for whole packets: a DNS answer over UDP may be as large as an IP datagram
// (reassembled by conntrack before the hooks see it).
const copyRange = 0xffff

// Packet is one queued packet, held by the kernel until its verdict.
type Packet struct {
	ID uint32
	// Hook is the netfilter hook it was queued at (NF_INET_*).
	Hook uint8
	// Payload is the packet from its IP header on.
	Payload []byte
}

// Conn is a socket bound to one queue.
type Conn struct {
	c     *nfsubsys.Conn
	queue uint16
}

// Open binds queue num in the caller's network namespace. maxLen bounds the packets the kernel
// holds for it; beyond that they pass unjudged (fail open).
func Open(num uint16, maxLen uint32) (*Conn, error) {
	c, err := nfsubsys.Dial(subsysQueue)
	if err != nil {
		return nil, fmt.Errorf("nfqueue: netlink socket: %w", err)
	}
	q := &Conn{c: c, queue: num}
	cmd := func(family uint8, resID uint16, command, pf uint8) error {
		return c.Request(msgConfig, family, resID, []netlink.Attribute{{Type: cfgAttrCmd, Data: []byte{command, 0, 0, pf}}})
	}
	// PF_UNBIND and PF_BIND were needed before Linux 3.8; later kernels ignore them.
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		_ = cmd(fam, 0, cmdPFUnbind, fam)
		_ = cmd(fam, 0, cmdPFBind, fam)
	}
	if err := cmd(unix.AF_UNSPEC, num, cmdBind, 0); err != nil {
		c.Close()
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("nfqueue: queue %d is bound by another process in this network namespace (one reader per queue): %w", num, err)
		}
		return nil, fmt.Errorf("nfqueue: binding queue %d: %w", num, err)
	}
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params[0:4], copyRange)
	params[4] = copyPacket
	flags := uint32(flagFailOpen | flagGSO)
	attrs := []netlink.Attribute{
		{Type: cfgAttrParams, Data: params},
		{Type: cfgAttrMaxLen, Data: nfsubsys.BE32(maxLen)},
		{Type: cfgAttrFlags, Data: nfsubsys.BE32(flags)},
		{Type: cfgAttrMask, Data: nfsubsys.BE32(flags)},
	}
	if err := c.Request(msgConfig, unix.AF_UNSPEC, num, attrs); err != nil {
		q.Close()
		return nil, fmt.Errorf("nfqueue: configuring queue %d: %w", num, err)
	}
	// A burst of answers waits in the socket buffer rather than being lost (ENOBUFS): with
	// fail-open, the kernel lets through a packet whose message it could not deliver.
	_ = c.SetReadBuffer(4 << 20)
	return q, nil
}

// Close closes the socket, which unbinds the queue: the kernel drops the packets it held for
// it (a DNS client asks again), and with the rule's bypass lets the next ones through.
func (q *Conn) Close() error { return q.c.Close() }

// SetReadDeadline makes a blocked Receive return at t, to stop a reader.
func (q *Conn) SetReadDeadline(t time.Time) error { return q.c.SetReadDeadline(t) }

// ErrLost is returned (wrapped) by Receive when the socket's buffer overflowed and the kernel
// dropped messages (with fail-open, their packets went through unread).
var ErrLost = nfsubsys.ErrLost

// Receive waits for queued packets. Messages it cannot parse are skipped (their packets wait
// in the kernel; a reader that closes lets them pass).
func (q *Conn) Receive() ([]Packet, error) {
	bodies, err := q.c.Receive(msgPacket)
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

func parsePacket(b []byte) (Packet, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return Packet{}, false
	}
	var p Packet
	hdr := false
	for ad.Next() {
		switch ad.Type() {
		case attrPacketHdr:
			if d := ad.Bytes(); len(d) >= 7 {
				p.ID, p.Hook, hdr = binary.BigEndian.Uint32(d[0:4]), d[6], true
			}
		case attrPayload:
			p.Payload = ad.Bytes()
		}
	}
	return p, ad.Err() == nil && hdr
}

// Accept lets the packet go on through the hook (the rules after the queue's see it).
func (q *Conn) Accept(id uint32) error { return q.verdict(id, verdictAccept) }

// Drop drops the packet.
func (q *Conn) Drop(id uint32) error { return q.verdict(id, verdictDrop) }

func (q *Conn) verdict(id, v uint32) error {
	hdr := make([]byte, 8)
	binary.BigEndian.PutUint32(hdr[0:4], v)
	binary.BigEndian.PutUint32(hdr[4:8], id)
	return q.c.Send(msgVerdict, unix.AF_UNSPEC, q.queue, []netlink.Attribute{{Type: attrVerdictHdr, Data: hdr}})
}
