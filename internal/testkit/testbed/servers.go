package testbed

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	tokenLen   = 16
	protoSCTP  = 132
	sctpHdrLen = 12
	// common header + INIT chunk with no parameters
	sctpInitLen = sctpHdrLen + 20
)

// servers is the set of listeners running for one netns.
type servers struct {
	mu      sync.Mutex
	closers []io.Closer
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

func (s *servers) add(c io.Closer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closers = append(s.closers, c)
}

func (s *servers) trackConn(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *servers) untrackConn(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// close closes every socket and waits for all server goroutines to exit.
func (s *servers) close() {
	s.mu.Lock()
	s.closed = true
	for _, c := range s.closers {
		c.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func freebindControl(network, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		if strings.HasSuffix(network, "6") {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
		}
	})
	return errors.Join(err, serr)
}

// startServers creates, inside ns, a TCP and a UDP echo server per address
// and configured port, plus one raw SCTP receiver per address family. The
// sockets keep their netns, so serving happens on ordinary goroutines.
func (b *Bed) startServers(ns netns.NsHandle, ips []netip.Addr) (*servers, error) {
	s := &servers{conns: map[net.Conn]struct{}{}}
	var tcpLs []net.Listener
	var udpCs []*net.UDPConn
	var sctpCs []*net.IPConn
	err := inNetNSGo(ns, func() error {
		// Freebind: an address on a bridge without carrier (no pods yet) is
		// still tentative and could not be bound otherwise.
		lc := net.ListenConfig{Control: freebindControl}
		ctx := context.Background()
		for _, ip := range ips {
			for _, port := range b.cfg.TCPPorts {
				l, err := lc.Listen(ctx, "tcp", netip.AddrPortFrom(ip, port).String())
				if err != nil {
					return err
				}
				s.add(l)
				tcpLs = append(tcpLs, l)
			}
			for _, port := range b.cfg.UDPPorts {
				c, err := lc.ListenPacket(ctx, "udp", netip.AddrPortFrom(ip, port).String())
				if err != nil {
					return err
				}
				s.add(c)
				udpCs = append(udpCs, c.(*net.UDPConn))
			}
			network := "ip4:132"
			if ip.Is6() {
				network = "ip6:132"
			}
			c, err := net.ListenPacket(network, "")
			if err != nil {
				return err
			}
			s.add(c)
			ic := c.(*net.IPConn)
			if ip.Is6() {
				rc, err := ic.SyscallConn()
				if err != nil {
					return err
				}
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
				}); err != nil {
					return err
				}
				if serr != nil {
					return serr
				}
			}
			sctpCs = append(sctpCs, ic)
		}
		return nil
	})
	if err != nil {
		s.close()
		return nil, err
	}
	for _, l := range tcpLs {
		s.wg.Add(1)
		go s.serveTCP(l)
	}
	for _, c := range udpCs {
		s.wg.Add(1)
		go s.serveUDP(c)
	}
	for _, c := range sctpCs {
		s.wg.Add(1)
		go b.serveSCTP(s, c)
	}
	return s, nil
}

// acceptLoop hands every connection l accepts to handle, until l is closed or handle returns
// false. A transient accept error (too many open files) is retried.
func acceptLoop(l net.Listener, handle func(net.Conn) bool) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if !handle(c) {
			return
		}
	}
}

func (s *servers) serveTCP(l net.Listener) {
	defer s.wg.Done()
	acceptLoop(l, func(c net.Conn) bool {
		if !s.trackConn(c) {
			c.Close()
			return false
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrackConn(c)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, tokenLen)
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			_, _ = c.Write(buf)
		}()
		return true
	})
}

func (s *servers) serveUDP(c *net.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = c.WriteToUDPAddrPort(buf[:n], from)
	}
}

// serveSCTP reads raw SCTP packets (IPv4: including the IP header; IPv6:
// without, the destination comes from IPV6_PKTINFO) and reports INIT chunks.
func (b *Bed) serveSCTP(s *servers, c *net.IPConn) {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	oob := make([]byte, 512)
	for {
		n, oobn, _, _, err := c.ReadMsgIP(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		pkt := buf[:n]
		var dst netip.Addr
		if n >= 20 && pkt[0]>>4 == 4 {
			ihl := int(pkt[0]&0x0f) * 4
			if ihl < 20 || n < ihl || pkt[9] != protoSCTP {
				continue
			}
			dst = netip.AddrFrom4([4]byte(pkt[16:20]))
			pkt = pkt[ihl:]
		} else {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				continue
			}
			for _, m := range msgs {
				if m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= 16 {
					dst = netip.AddrFrom16([16]byte(m.Data[:16]))
				}
			}
			if !dst.IsValid() {
				continue
			}
		}
		port, nonce, ok := parseSCTPInit(pkt)
		if !ok {
			continue
		}
		b.sctpDeliver(dst, port, nonce)
	}
}

// buildSCTPInit returns an SCTP packet (common header + INIT chunk) with a
// valid CRC32c checksum. The INIT's initiate tag carries nonce.
func buildSCTPInit(srcPort, dstPort uint16, nonce, tsn uint32) []byte {
	p := make([]byte, sctpInitLen)
	binary.BigEndian.PutUint16(p[0:], srcPort)
	binary.BigEndian.PutUint16(p[2:], dstPort)
	// p[4:8] verification tag: must be 0 in a packet carrying INIT.
	// p[8:12] checksum, filled below.
	p[12] = 1 // chunk type INIT
	p[13] = 0 // flags
	binary.BigEndian.PutUint16(p[14:], 20)
	binary.BigEndian.PutUint32(p[16:], nonce) // initiate tag
	binary.BigEndian.PutUint32(p[20:], 65535) // a_rwnd
	binary.BigEndian.PutUint16(p[24:], 10)    // outbound streams
	binary.BigEndian.PutUint16(p[26:], 10)    // max inbound streams
	binary.BigEndian.PutUint32(p[28:], tsn)   // initial TSN
	// CRC32c over the whole packet with a zero checksum field; the kernel
	// (sctp_compute_cksum) stores it little-endian.
	binary.LittleEndian.PutUint32(p[8:], crc32c(p))
	return p
}

func parseSCTPInit(p []byte) (dstPort uint16, nonce uint32, ok bool) {
	if len(p) < sctpInitLen {
		return 0, 0, false
	}
	if binary.BigEndian.Uint32(p[4:8]) != 0 || p[12] != 1 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint16(p[2:4]), binary.BigEndian.Uint32(p[16:20]), true
}
