// Package kernelwatch reports, as the kernel commits them, the nf_tables changes that other
// processes make to the tables the agent keeps: the notifications every nf_tables commit sends
// to the NFNLGRP_NFTABLES group (`nft monitor` reads the same), which iptables-nft raises too.
// A periodic check alone leaves a flushed table open until its next run (30 s by default);
// with these the agent repairs within milliseconds of the commit that broke its rules.
//
// Each commit ends with a NEWGEN message naming the process that made it; the messages before
// it name the tables it touched. A commit of the agent's own (in-process netlink, or a tool it
// ran) is told apart by Config.Ours and never reported. A receive buffer that overflowed lost
// notifications: that is reported as a change of every watched table.
//
// iptables-legacy and ipset raise no such notifications; their changes are found by the
// agent's periodic check.
package kernelwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Table names an nf_tables table: Family as nft spells it (inet, ip, ip6, arp, bridge, netdev).
type Table struct {
	Family string
	Name   string
}

func (t Table) String() string { return t.Family + " " + t.Name }

// Change is one commit of another process that touched watched tables.
type Change struct {
	PID        int    // as the kernel reports it (the committing thread, in the initial PID namespace)
	Process    string // its command name
	Generation uint32 // the generation the commit made (see Generation)
	Tables     []Table
	// Lost is set when notifications were dropped (the receive buffer overflowed): any
	// watched table may have changed.
	Lost bool
	At   time.Time // when the notification was read
}

// Config says what to watch.
type Config struct {
	Tables []Table
	// Ours reports whether the process that committed a change (and the generation the commit
	// made) is the agent itself or a tool it ran; such changes are not reported.
	Ours func(pid int, process string, generation uint32) bool
}

// Watcher reads the notifications of the network namespace it was opened in.
type Watcher struct {
	fd      int
	cfg     Config
	watched map[Table]bool
}

const (
	nfnlSubsysNFTables = 10
	nfnlGroupNFTables  = 7

	msgNewGen    = 15
	attrTable    = 1 // the table attribute of table, chain, rule, set, element, object and flowtable messages
	attrGenID    = 1
	attrGenPID   = 2
	attrGenName  = 3
	nlaTypeMask  = 0x3fff
	recvBufBytes = 8 << 20
)

var familyNames = map[uint8]string{1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}

// Open subscribes to the nf_tables notifications of the caller's network namespace.
func Open(cfg Config) (*Watcher, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("kernelwatch: netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kernelwatch: bind: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, nfnlGroupNFTables); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kernelwatch: joining the nf_tables group: %w", err)
	}
	// A full sync of a large table commits thousands of elements, each one notification: a
	// large buffer keeps those from overflowing it (an overflow only costs a verify).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, recvBufBytes) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, recvBufBytes)
	}
	// Receives wake up this often to see whether the context is done.
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kernelwatch: receive timeout: %w", err)
	}
	w := &Watcher{fd: fd, cfg: cfg, watched: map[Table]bool{}}
	for _, t := range cfg.Tables {
		w.watched[t] = true
	}
	return w, nil
}

// Run reads notifications until ctx is done, calling changed for every commit of another
// process that touched a watched table. It closes the watcher when it returns.
func (w *Watcher) Run(ctx context.Context, changed func(Change)) error {
	defer unix.Close(w.fd)
	buf := make([]byte, 1<<16)
	var touched []Table // watched tables the current commit touched so far
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS):
			touched = touched[:0]
			changed(Change{Lost: true, Tables: slices.Clone(w.cfg.Tables), At: time.Now()})
			continue
		case err != nil:
			return fmt.Errorf("kernelwatch: receive: %w", err)
		}
		for msg := buf[:n]; len(msg) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(msg[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(msg) {
				break
			}
			typ := binary.NativeEndian.Uint16(msg[4:6])
			body := msg[unix.NLMSG_HDRLEN:l]
			msg = msg[min(nlmsgAlign(l), len(msg)):]
			if typ>>8 != nfnlSubsysNFTables || len(body) < 4 {
				continue
			}
			family, attrs := body[0], body[4:]
			if typ&0xff == msgNewGen {
				pid, name, gen := genInfo(attrs)
				if len(touched) > 0 && (w.cfg.Ours == nil || !w.cfg.Ours(pid, name, gen)) {
					changed(Change{PID: pid, Process: name, Generation: gen, Tables: slices.Clone(touched), At: time.Now()})
				}
				touched = touched[:0]
				continue
			}
			if name, ok := attrString(attrs, attrTable); ok {
				t := Table{Family: familyNames[family], Name: name}
				if w.watched[t] && !slices.Contains(touched, t) {
					touched = append(touched, t)
				}
			}
		}
	}
	return nil
}

func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// attrs calls fn for each netlink attribute until it returns false.
func eachAttr(b []byte, fn func(typ uint16, val []byte) bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		if !fn(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[4:l]) {
			return
		}
		b = b[min((l+3)&^3, len(b)):]
	}
}

func attrString(b []byte, want uint16) (string, bool) {
	var s string
	found := false
	eachAttr(b, func(typ uint16, val []byte) bool {
		if typ == want {
			s, found = strings.TrimRight(string(val), "\x00"), true
			return false
		}
		return true
	})
	return s, found
}

func genInfo(b []byte) (pid int, name string, gen uint32) {
	eachAttr(b, func(typ uint16, val []byte) bool {
		switch {
		case typ == attrGenID && len(val) == 4:
			gen = binary.BigEndian.Uint32(val)
		case typ == attrGenPID && len(val) == 4:
			pid = int(binary.BigEndian.Uint32(val))
		case typ == attrGenName:
			name = strings.TrimRight(string(val), "\x00")
		}
		return true
	})
	return pid, name, gen
}
