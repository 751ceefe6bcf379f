package nftnl

import (
	"errors"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestSendErrorReachesEveryReceive: a batch that never left must fail its receives at once,
// not wait for replies until the receive timeout.
func TestSendErrorReachesEveryReceive(t *testing.T) {
	s, err := openSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096); err != nil {
		t.Fatal(err)
	}
	s.sndbuf = 1 << 30 // as if the buffer had room, so that send does not grow it

	big := netlink.Message{Header: netlink.Header{Type: 1, Flags: netlink.Request | netlink.Acknowledge, Length: 16 + 1<<16},
		Data: make([]byte, 1<<16)}
	if _, err := s.exchange([]netlink.Message{big}); !errors.Is(err, unix.EMSGSIZE) {
		t.Fatalf("sending a datagram larger than the send buffer: %v, want EMSGSIZE", err)
	}
	// Each receive gets the send's error (a receive that waited for a reply would end in a
	// timeout error instead).
	for range 3 {
		if _, err := s.exchange(nil); !errors.Is(err, unix.EMSGSIZE) {
			t.Fatalf("receive after a failed send: %v, want the send's EMSGSIZE", err)
		}
	}
}

// TestReleaseToCollector: the hand-off to the kernel's collector succeeds (release falls back
// to a plain close only when it fails, which would bring back the wait at exit) and leaves
// the descriptor closed.
func TestReleaseToCollector(t *testing.T) {
	s, err := openSocket()
	if err != nil {
		t.Fatal(err)
	}
	fd := s.fd
	if err := releaseToCollector(fd); err != nil {
		s.close()
		t.Fatalf("handing an nfnetlink socket to the collector: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("descriptor %d after the hand-off: %v, want EBADF", fd, err)
	}
}
