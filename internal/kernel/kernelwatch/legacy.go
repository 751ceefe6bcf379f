package kernelwatch

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// iptables-legacy tables raise no notifications. What the kernel does give cheaply, without
// copying a table's rules, is its shape: IPT_SO_GET_INFO returns each hook's entry offset, the
// number of rules and the size of the blob. Any rule added, deleted or moved (a flush, an
// insert ahead of our jump, a restore) changes it; a rule replaced by one of the same size
// does not, and is left to the periodic check.

const (
	soGetInfo  = 64 // IPT_SO_GET_INFO and IP6T_SO_GET_INFO
	getInfoLen = 32 + 4 + 5*4 + 5*4 + 4 + 4
)

// LegacyShape is the shape of one iptables-legacy table.
type LegacyShape struct {
	HookEntry [5]uint32
	Entries   uint32
	Size      uint32
}

// LegacyTable reads the shape of table (filter, mangle, nat, raw) of one family in the
// caller's network namespace. The table must exist: asking for one that does not loads it.
func LegacyTable(v6 bool, table string) (LegacyShape, error) {
	family, level := unix.AF_INET, unix.SOL_IP
	if v6 {
		family, level = unix.AF_INET6, unix.SOL_IPV6
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return LegacyShape{}, fmt.Errorf("kernelwatch: raw socket: %w", err)
	}
	defer unix.Close(fd)
	var buf [getInfoLen]byte
	copy(buf[:31], table)
	l := uint32(len(buf))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soGetInfo,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return LegacyShape{}, fmt.Errorf("kernelwatch: %s table info: %w", table, e)
	}
	var s LegacyShape
	off := 32 + 4
	for i := range s.HookEntry {
		s.HookEntry[i] = binary.NativeEndian.Uint32(buf[off+4*i:])
	}
	off += 5*4 + 5*4
	s.Entries = binary.NativeEndian.Uint32(buf[off:])
	s.Size = binary.NativeEndian.Uint32(buf[off+4:])
	return s, nil
}
