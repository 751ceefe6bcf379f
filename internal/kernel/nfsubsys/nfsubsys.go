// Package nfsubsys is a netfilter netlink socket talking to one subsystem that hands packets
// to userspace (nfnetlink_log, nfnetlink_queue): its config requests and the packet messages
// it sends, which both readers of packets share.
package nfsubsys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conn is a socket of one subsystem (NFNL_SUBSYS_*).
type Conn struct {
	c      *netlink.Conn
	subsys uint8
	// pending are packet messages that came while a Request waited for its answer (a bound
	// queue or group delivers at once), for the next Receive.
	pending []netlink.Message
}

// Dial opens a socket in the caller's network namespace.
func Dial(subsys uint8) (*Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, subsys: subsys}, nil
}

// Request sends message msg of the subsystem with attrs after the nfgenmsg header of family
// and resID (a group or queue number), and waits for the kernel's acknowledgement. Packet
// messages that come meanwhile are kept for Receive. It must not run beside Receive.
func (c *Conn) Request(msg, family uint8, resID uint16, attrs []netlink.Attribute) error {
	body, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	sent, err := c.c.Send(c.message(msg, family, resID, body, netlink.Request|netlink.Acknowledge))
	if err != nil {
		return err
	}
	for {
		msgs, err := c.c.Receive() // an error answer to the request comes back as err
		if err != nil {
			return err
		}
		acked := false
		for _, m := range msgs {
			if m.Header.Type == netlink.Error && m.Header.Sequence == sent.Header.Sequence {
				acked = true
				continue
			}
			c.pending = append(c.pending, m)
		}
		if acked {
			return nil
		}
	}
}

// Send sends message msg without waiting for an acknowledgement (a verdict).
func (c *Conn) Send(msg, family uint8, resID uint16, attrs []netlink.Attribute) error {
	body, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	_, err = c.c.Send(c.message(msg, family, resID, body, netlink.Request))
	return err
}

func (c *Conn) message(msg, family uint8, resID uint16, body []byte, flags netlink.HeaderFlags) netlink.Message {
	h := []byte{family, 0 /* NFNETLINK_V0 */, 0, 0}
	binary.BigEndian.PutUint16(h[2:], resID)
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(uint16(c.subsys)<<8 | uint16(msg)), Flags: flags},
		Data:   append(h, body...),
	}
}

// ErrLost is returned (wrapped) by Receive when the socket's buffer overflowed and the kernel
// dropped messages; reading may go on.
var ErrLost = errors.New("messages lost, socket buffer full")

// Receive waits for messages and returns the attributes (after the nfgenmsg header) of those
// of type msg.
func (c *Conn) Receive(msg uint8) ([][]byte, error) {
	msgs := c.pending
	c.pending = nil
	if len(msgs) == 0 {
		var err error
		if msgs, err = c.c.Receive(); err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				return nil, fmt.Errorf("%w: %v", ErrLost, err)
			}
			return nil, err
		}
	}
	want := netlink.HeaderType(uint16(c.subsys)<<8 | uint16(msg))
	var out [][]byte
	for _, m := range msgs {
		if m.Header.Type == want && len(m.Data) >= 4 {
			out = append(out, m.Data[4:])
		}
	}
	return out, nil
}

// SetReadBuffer sizes the socket's receive buffer.
func (c *Conn) SetReadBuffer(n int) error { return c.c.SetReadBuffer(n) }

// SetReadDeadline makes a blocked Receive return at t.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.c.SetReadDeadline(t) }

// Close closes the socket; the kernel drops what it bound.
func (c *Conn) Close() error { return c.c.Close() }

// BE32 is v as the big-endian attribute value nfnetlink expects.
func BE32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
