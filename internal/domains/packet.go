package domains

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// segment is a queued DNS reply packet: its addresses and ports, and for TCP its sequence
// number, flags and payload.
type segment struct {
	src, dst      netip.AddrPort
	tcp           bool
	seq           uint32
	syn, fin, rst bool
	payload       []byte
}

// parseSegment reads an IPv4 or IPv6 packet carrying UDP or TCP. IPv6 extension headers are
// not followed (a reply carrying them is let through unread).
func parseSegment(b []byte) (segment, bool) {
	var s segment
	if len(b) < 1 {
		return s, false
	}
	var proto uint8
	var src, dst netip.Addr
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 || len(b) < ihl {
			return s, false
		}
		if binary.BigEndian.Uint16(b[6:8])&0x3fff != 0 {
			return s, false // a fragment: conntrack reassembles before the hooks, so none is expected
		}
		total := int(binary.BigEndian.Uint16(b[2:4]))
		if total < ihl || total > len(b) {
			total = len(b) // GSO packets may carry 0 here
		}
		src, dst, proto, l4 = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[9], b[ihl:total]
	case 6:
		if len(b) < 40 {
			return s, false
		}
		end := 40 + int(binary.BigEndian.Uint16(b[4:6]))
		if end <= 40 || end > len(b) {
			end = len(b)
		}
		src, dst, proto, l4 = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[6], b[40:end]
	default:
		return s, false
	}
	switch proto {
	case unix.IPPROTO_UDP:
		if len(l4) < 8 {
			return s, false
		}
		s.payload = l4[8:]
	case unix.IPPROTO_TCP:
		if len(l4) < 20 {
			return s, false
		}
		off := int(l4[12]>>4) * 4
		if off < 20 || off > len(l4) {
			return s, false
		}
		flags := l4[13]
		s.tcp, s.seq = true, binary.BigEndian.Uint32(l4[4:8])
		s.fin, s.syn, s.rst = flags&0x01 != 0, flags&0x02 != 0, flags&0x04 != 0
		s.payload = l4[off:]
	default:
		return s, false
	}
	s.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:2]))
	s.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:4]))
	return s, true
}

// tcpStreams reassembles the server-to-pod side of DNS over TCP: each message is two bytes of
// length and the message. A segment that completes messages is held until their addresses
// are in the kernel; any other is let through at once. A stream whose segments come out of
// order is given up (its later answers pass unread): the pod retries, and a retransmission
// of bytes already read is let through.
type tcpStreams struct {
	flows map[[2]netip.AddrPort]*tcpStream
}

type tcpStream struct {
	next   uint32 // sequence number of the next byte expected
	buf    []byte // bytes of an incomplete message
	broken bool
}

// maxTCPFlows bounds the streams followed at once (each buffers at most one message, 64 KiB);
// beyond it, one is forgotten to make room.
const maxTCPFlows = 256

// add takes a segment and returns the DNS messages it completes.
func (t *tcpStreams) add(s segment) [][]byte {
	if t.flows == nil {
		t.flows = map[[2]netip.AddrPort]*tcpStream{}
	}
	key := [2]netip.AddrPort{s.src, s.dst}
	st := t.flows[key]
	if s.syn {
		if len(t.flows) >= maxTCPFlows {
			for k := range t.flows { // any one: the map has no order, a bound is what matters
				delete(t.flows, k)
				break
			}
		}
		t.flows[key] = &tcpStream{next: s.seq + 1}
		return nil
	}
	if st == nil {
		return nil // not seen from its start
	}
	if s.rst || s.fin {
		defer delete(t.flows, key)
	}
	if st.broken || len(s.payload) == 0 {
		return nil
	}
	switch d := int32(s.seq - st.next); {
	case d < 0 && int32(s.seq+uint32(len(s.payload))-st.next) <= 0:
		return nil // a retransmission of bytes already read
	case d < 0:
		s.payload = s.payload[-d:] // overlaps what was read: take the new bytes
	case d > 0:
		st.broken, st.buf = true, nil // a gap: bytes before this segment are missing
		return nil
	}
	st.next += uint32(len(s.payload))
	st.buf = append(st.buf, s.payload...)
	var msgs [][]byte
	for len(st.buf) >= 2 {
		n := int(binary.BigEndian.Uint16(st.buf))
		if len(st.buf) < 2+n {
			break
		}
		msgs = append(msgs, st.buf[2:2+n])
		st.buf = st.buf[2+n:]
	}
	if len(st.buf) == 0 {
		st.buf = nil
	} else {
		st.buf = append([]byte(nil), st.buf...) // the rest only: do not keep the packet
	}
	return msgs
}
