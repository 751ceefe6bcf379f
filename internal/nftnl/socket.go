package nftnl

import (
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
}

// receiveTimeout bounds a wait for the kernel's reply, so that a reply that never comes
// fails the batch instead of hanging the caller.
const receiveTimeout = 10 // seconds

func openSocket() (*socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	s := &socket{fd: fd, buf: make([]byte, 1<<16)}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		s.close()
		return nil, os.NewSyscallError("bind", err)
	}
	tv := unix.Timeval{Sec: receiveTimeout}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		s.close()
		return nil, os.NewSyscallError("setsockopt", err)
	}
	// Errors carry the kernel's explanation when it has one; older kernels refuse the option.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	return s, nil
}

func (s *socket) close() {
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
}

// exchange is the nltest.Func: called with messages it sends them in one datagram; called
// with none it returns the messages of the next datagram the kernel sent.
func (s *socket) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if s.fd < 0 {
		return nil, os.NewSyscallError("sendmsg", unix.EBADF)
	}
	if len(req) > 0 {
		return nil, s.send(req)
	}
	return s.receive()
}

func (s *socket) send(req []netlink.Message) error {
	size := 0
	for _, m := range req {
		size += int(m.Header.Length)
	}
	out := make([]byte, 0, size)
	for _, m := range req {
		b, err := m.MarshalBinary()
		if err != nil {
			return fmt.Errorf("nfnetlink: encoding message: %w", err)
		}
		out = append(out, b...)
	}
	for {
		err := unix.Sendto(s.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		return nil
	}
}

func (s *socket) receive() ([]netlink.Message, error) {
	var n int
	for {
		var err error
		// MSG_TRUNC makes the kernel report the datagram's full length, so a reply larger
		// than the buffer is retried with a larger one rather than silently cut.
		n, _, err = unix.Recvfrom(s.fd, s.buf, unix.MSG_PEEK|unix.MSG_TRUNC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				return nil, fmt.Errorf("nfnetlink: no reply from the kernel within %ds", receiveTimeout)
			}
			return nil, os.NewSyscallError("recvmsg", err)
		}
		if n > len(s.buf) {
			s.buf = make([]byte, n)
		}
		n, _, err = unix.Recvfrom(s.fd, s.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, os.NewSyscallError("recvmsg", err)
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
	}
	return msgs, nil
}
