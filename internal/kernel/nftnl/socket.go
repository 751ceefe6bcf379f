package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"
)

// socket is the nfnetlink transport under a Conn: plain blocking system calls on one file
// descriptor.
//
// Why not the socket google/nftables dials itself: github.com/mdlayher/socket starts a
// goroutine to watch for cancellation on every send and receive, and google/nftables
// receives one acknowledgement per message of a batch. On a thread locked to a network
// namespace (the agent in tests, a CNI plugin) each of those goroutines costs two thread
// hand-offs; a 17-message batch spent ~3 ms waiting on them against ~0.8 ms of kernel work.
// google/nftables accepts any transport through its nltest hook, which is what this plugs in.
type socket struct {
	fd  int
	buf []byte
	// sendErr is the failure of the last send. nltest's socket reports a send's error only
	// on the next receive, so every receive returns it until the next send: no reply can
	// come for messages that never left.
	sendErr error
	sndbuf  int // the send buffer asked for so far, 0 for the default
	// comments, during BatchWithComments, are added to the messages creating their objects.
	comments *Comments
	// replies are the replies to the last batch sent, one per message, for exchange to hand
	// out (see send).
	replies []netlink.Message
}

// receiveTimeout bounds a wait for the kernel's reply, so that a reply that never comes
// fails the batch instead of hanging the caller.
const receiveTimeout = 10 // seconds

// ackBuffer is the receive buffer asked for: room for the acks of about 100,000 messages.
const ackBuffer = 16 << 20

func openSocket() (*socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	s := &socket{fd: fd, buf: make([]byte, 1<<17)}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		s.close()
		return nil, os.NewSyscallError("bind", err)
	}
	tv := unix.Timeval{Sec: receiveTimeout}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		s.close()
		return nil, os.NewSyscallError("setsockopt", err)
	}
	// The kernel queues one acknowledgement per message of a batch before we read any, and a
	// batch that rewrites many chains (a cluster-wide ClusterNetworkPolicy deleted) holds
	// thousands of messages: at the default buffer size the acks overflow it (ENOBUFS) and
	// the whole batch is lost. The buffer is only committed as acks arrive. FORCE needs
	// CAP_NET_ADMIN, which every caller has; SO_RCVBUF is the capped fallback.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ackBuffer); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, ackBuffer)
	}
	// Errors carry the kernel's explanation when it has one; older kernels refuse the option.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	// An error then carries the failed request's header rather than the whole request, which
	// for a batch of set elements can exceed any buffer: every reply but a dump's is small,
	// and a dump's datagrams are sized by the buffer we receive into.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return s, nil
}

func (s *socket) close() {
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
}

// release closes the socket for an owner that exits right after (a CNI plugin), without the
// wait that a close after a deleting commit costs (see Conn). The descriptor is sent, together
// with the receiving end itself, into a unix socket pair that is then closed: a cycle that
// only the kernel's collector of in-flight descriptors frees. Since Linux 6.9 (commit
// 8b90a9f819dc, "af_unix: Run GC on only one CPU", also in 6.6 stable) that collector runs in
// a workqueue, so the nfnetlink socket is released there, and the wait for the RCU grace
// period happens in a kernel worker instead of in the exiting process. Older kernels collect
// in the closing task, which costs what a plain close does. Everything the socket
// committed is in effect before this is called; only the freeing of deleted objects is left.
func (s *socket) release() {
	if s.fd >= 0 && releaseToCollector(s.fd) == nil {
		s.fd = -1
	}
	s.close() // what the hand-off could not take
}

// releaseToCollector hands fd to the unix garbage collector and closes it, or fails leaving
// fd open.
func releaseToCollector(fd int) error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.Sendmsg(pair[0], []byte{0}, unix.UnixRights(pair[1], fd), nil, 0); err != nil {
		_ = unix.Close(pair[0])
		_ = unix.Close(pair[1])
		return err
	}
	// The datagram in pair[1]'s queue holds pair[1] and fd; closing our descriptors leaves
	// those references as an unreachable cycle, and closing pair[0] schedules the collector.
	_ = unix.Close(fd)
	_ = unix.Close(pair[1])
	_ = unix.Close(pair[0])
	return nil
}

// exchange is the nltest.Func: called with messages it sends them in one datagram; called
// with none it returns the messages of the next datagram the kernel sent.
func (s *socket) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if s.fd < 0 {
		return nil, os.NewSyscallError("sendmsg", unix.EBADF)
	}
	if len(req) > 0 {
		s.replies = s.replies[:0]
		s.sendErr = s.send(req)
		return nil, s.sendErr
	}
	if s.sendErr != nil {
		return nil, s.sendErr
	}
	if len(s.replies) > 0 {
		r := s.replies[0]
		s.replies = s.replies[1:]
		return []netlink.Message{r}, nil
	}
	return s.receive(0)
}

func (s *socket) send(req []netlink.Message) error {
	size := 0
	for _, m := range req {
		size += int(m.Header.Length)
	}
	// A batch is sent without asking the kernel to acknowledge its messages: it reports a
	// failed message whether asked or not, and it has processed the whole batch by the time
	// the send returns (nfnetlink handles a batch in the sender's system call), so the
	// replies google/nftables reads, one per message, are made here: the kernel's error for
	// a message that has one, else an acknowledgement. nft reads a batch's replies the same
	// way. At the benchmark's scale a full sync is 6,000 messages, whose acknowledgements
	// cost the kernel an allocation and us a read each.
	batch := len(req) > 2 && req[0].Header.Type == netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN)
	var acked []netlink.Header
	out := make([]byte, 0, size)
	for _, m := range req {
		if batch && m.Header.Flags&netlink.Acknowledge != 0 {
			acked = append(acked, m.Header)
			m.Header.Flags &^= netlink.Acknowledge
		}
		// google/nftables asks the kernel to echo every rule it adds, a full copy of the rule
		// that the kernel builds and queues and that Flush reads and discards (it hands no
		// rule handles back). The acknowledgement alone says the same.
		m.Header.Flags &^= unix.NLM_F_ECHO
		if s.comments != nil {
			var err error
			if m, err = s.comments.withComment(m); err != nil {
				return err
			}
		}
		b, err := m.MarshalBinary()
		if err != nil {
			return fmt.Errorf("nfnetlink: encoding message: %w", err)
		}
		out = append(out, b...)
	}
	if len(out) > s.sndbuf {
		// A batch goes in one datagram, which the kernel refuses (EMSGSIZE) when it is
		// larger than the send buffer: a full sync at scale is megabytes. nft sizes its
		// buffer to each batch the same way.
		if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(out)); err != nil {
			_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, len(out))
		}
		s.sndbuf = len(out)
	}
	for {
		err := unix.Sendto(s.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		break
	}
	if batch {
		return s.batchReplies(acked)
	}
	return nil
}

// batchReplies reads what the kernel sent about a batch whose messages (acked, in order) were
// sent without asking for acknowledgements, and queues one reply per message for exchange.
func (s *socket) batchReplies(acked []netlink.Header) error {
	// The kernel's error for each message that has one, by sequence number (nil: none).
	errs := make(map[uint32]*netlink.Message, len(acked))
	for _, h := range acked {
		errs[h.Sequence] = nil
	}
	for {
		msgs, err := s.receive(unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.Error || len(m.Data) < 4 {
				continue
			}
			if _, ours := errs[m.Header.Sequence]; ours {
				errs[m.Header.Sequence] = &m
			} else if code := int32(binary.NativeEndian.Uint32(m.Data)); code < 0 {
				// About the batch itself (its begin or end message): nothing was applied.
				return fmt.Errorf("nfnetlink: batch refused: %w", syscall.Errno(-code))
			}
		}
	}
	for _, h := range acked {
		if m := errs[h.Sequence]; m != nil {
			s.replies = append(s.replies, *m)
			continue
		}
		// An acknowledgement: error code 0, then the header of the request (NETLINK_CAP_ACK).
		data := make([]byte, 4+unix.NLMSG_HDRLEN)
		binary.NativeEndian.PutUint32(data[4:], unix.NLMSG_HDRLEN)
		binary.NativeEndian.PutUint16(data[8:], uint16(h.Type))
		binary.NativeEndian.PutUint16(data[10:], uint16(h.Flags))
		binary.NativeEndian.PutUint32(data[12:], h.Sequence)
		binary.NativeEndian.PutUint32(data[16:], h.PID)
		s.replies = append(s.replies, netlink.Message{
			Header: netlink.Header{Length: uint32(unix.NLMSG_HDRLEN + len(data)), Type: netlink.Error,
				Flags: netlink.HeaderFlags(unix.NLM_F_CAPPED), Sequence: h.Sequence, PID: nltest.PID},
			Data: data,
		})
	}
	return nil
}

// receive reads the next datagram; flags may add MSG_DONTWAIT, which makes an empty queue
// return EAGAIN.
func (s *socket) receive(flags int) ([]netlink.Message, error) {
	var n int
	for {
		var err error
		// One read per datagram. MSG_TRUNC makes the kernel report the datagram's full
		// length, so one larger than the buffer fails loudly rather than being silently cut;
		// with NETLINK_CAP_ACK none is.
		n, _, err = unix.Recvfrom(s.fd, s.buf, unix.MSG_TRUNC|flags)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			if flags&unix.MSG_DONTWAIT != 0 && errors.Is(err, unix.EAGAIN) {
				return nil, err
			}
			if errors.Is(err, unix.EAGAIN) {
				return nil, fmt.Errorf("nfnetlink: no reply from the kernel within %ds", receiveTimeout)
			}
			return nil, os.NewSyscallError("recvmsg", err)
		}
		if n > len(s.buf) {
			s.buf = make([]byte, n)
			return nil, fmt.Errorf("nfnetlink: a reply of %d bytes did not fit the receive buffer", n)
		}
		break
	}
	raw, err := syscall.ParseNetlinkMessage(s.buf[:n])
	if err != nil {
		return nil, fmt.Errorf("nfnetlink: decoding reply: %w", err)
	}
	msgs := make([]netlink.Message, len(raw))
	for i, m := range raw {
		msgs[i] = netlink.Message{
			Header: netlink.Header{
				Length:   m.Header.Len,
				Type:     netlink.HeaderType(m.Header.Type),
				Flags:    netlink.HeaderFlags(m.Header.Flags),
				Sequence: m.Header.Seq,
				// The netlink.Conn above this transport believes its port ID is
				// nltest.PID and checks replies against it.
				PID: nltest.PID,
			},
			Data: append([]byte(nil), m.Data...),
		}
		// With NETLINK_CAP_ACK an error carries the failed request's header without its
		// payload, but that header still states the request's full length, which
		// mdlayher/netlink adds to find the extended-ack attributes behind it. Say what is
		// there: the header alone.
		if m.Header.Type == unix.NLMSG_ERROR && m.Header.Flags&unix.NLM_F_CAPPED != 0 && len(msgs[i].Data) >= 4+unix.NLMSG_HDRLEN {
			binary.NativeEndian.PutUint32(msgs[i].Data[4:8], unix.NLMSG_HDRLEN)
		}
	}
	return msgs, nil
}

// Raw is a lasting nfnetlink socket for the subsystems google/nftables does not speak, such as
// conntrack. Like Conn, it is meant to stay open for its owner's life.
type Raw struct {
	sock *socket
	seq  uint32
}

// Release closes the socket for an owner that exits right after; see socket.release. Unlike a
// Conn, a released Raw cannot be used again.
func (r *Raw) Release() { r.sock.release() }

// DialRaw opens a Raw socket in the calling thread's network namespace.
func DialRaw() (*Raw, error) {
	s, err := openSocket()
	if err != nil {
		return nil, fmt.Errorf("nfnetlink: %w", err)
	}
	return &Raw{sock: s}, nil
}

// Dump sends a dump request and returns the data of every reply message. Replies to earlier
// requests (of a call that failed half-way) are skipped by their sequence number.
func (r *Raw) Dump(typ netlink.HeaderType, data []byte) ([][]byte, error) {
	r.seq++
	req := netlink.Message{Header: netlink.Header{Type: typ, Flags: netlink.Request | netlink.Dump, Sequence: r.seq,
		Length: uint32(16 + len(data))}, Data: data}
	if err := r.sock.send([]netlink.Message{req}); err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		msgs, err := r.sock.receive(0)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Sequence != r.seq {
				continue
			}
			switch {
			case m.Header.Type == netlink.Done && len(m.Data) < 4:
				return out, nil
			case m.Header.Type == netlink.Done, m.Header.Type == netlink.Error:
				// Both carry an error code; 0 ends a dump that succeeded.
				if err := ackError(m); err != nil {
					return nil, err
				}
				return out, nil
			}
			out = append(out, m.Data)
		}
	}
}

// requestsPerDatagram bounds one send of Requests: the kernel queues every acknowledgement
// in the socket's receive buffer before the send returns, and drops those that do not fit
// (about 256 with the default buffer); the send buffer bounds the datagram too.
const requestsPerDatagram = 128

// Requests sends one acknowledged request per element of data, in datagrams of at most
// requestsPerDatagram, and returns the error the kernel gave each (nil for success).
func (r *Raw) Requests(typ netlink.HeaderType, data [][]byte) ([]error, error) {
	errs := make([]error, len(data))
	for start := 0; start < len(data); start += requestsPerDatagram {
		chunk := data[start:min(start+requestsPerDatagram, len(data))]
		if err := r.requests(typ, chunk, errs[start:]); err != nil {
			return nil, err
		}
	}
	return errs, nil
}

func (r *Raw) requests(typ netlink.HeaderType, data [][]byte, errs []error) error {
	first := r.seq + 1
	msgs := make([]netlink.Message, len(data))
	for i, d := range data {
		r.seq++
		msgs[i] = netlink.Message{Header: netlink.Header{Type: typ, Flags: netlink.Request | netlink.Acknowledge,
			Sequence: r.seq, Length: uint32(16 + len(d))}, Data: d}
	}
	if err := r.sock.send(msgs); err != nil {
		return err
	}
	answered := make([]bool, len(data))
	for got := 0; got < len(data); {
		replies, err := r.sock.receive(0)
		if err != nil {
			return err
		}
		for _, m := range replies {
			i := int(m.Header.Sequence - first)
			if m.Header.Type != netlink.Error || i < 0 || i >= len(data) || answered[i] {
				continue
			}
			answered[i] = true
			errs[i] = ackError(m)
			got++
		}
	}
	return nil
}

// ackError decodes an NLMSG_ERROR message: nil for an acknowledgement.
func ackError(m netlink.Message) error {
	if len(m.Data) < 4 {
		return errors.New("nfnetlink: short error message")
	}
	if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
		return unix.Errno(-code)
	}
	return nil
}
