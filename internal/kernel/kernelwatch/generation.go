package kernelwatch

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

const msgGetGen = 16

// Generation returns the nf_tables generation of the caller's network namespace: the kernel
// counts every commit, and each commit's notification carries the generation it made. A tool
// whose commits are claimed by their generations (see command.Tracked) reads it before and
// after its run.
func Generation() (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("kernelwatch: netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("kernelwatch: bind: %w", err)
	}
	req := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], nfnlSubsysNFTables<<8|msgGetGen)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:12], 1)
	req[unix.NLMSG_HDRLEN] = unix.AF_UNSPEC
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("kernelwatch: asking the generation: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("kernelwatch: reading the generation: %w", err)
	}
	if n < unix.NLMSG_HDRLEN+4 {
		return 0, fmt.Errorf("kernelwatch: short generation reply (%d bytes)", n)
	}
	typ := binary.NativeEndian.Uint16(buf[4:6])
	if typ == unix.NLMSG_ERROR {
		errno := int32(binary.NativeEndian.Uint32(buf[unix.NLMSG_HDRLEN:]))
		return 0, fmt.Errorf("kernelwatch: generation: %w", unix.Errno(-errno))
	}
	var gen uint32
	found := false
	eachAttr(buf[unix.NLMSG_HDRLEN+4:n], func(t uint16, val []byte) bool {
		if t == attrGenID && len(val) == 4 {
			gen, found = binary.BigEndian.Uint32(val), true
			return false
		}
		return true
	})
	if !found {
		return 0, fmt.Errorf("kernelwatch: generation reply without an ID")
	}
	return gen, nil
}
