package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Protocol is an L4 protocol, spelled like Kubernetes' corev1.Protocol.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// A Probe is one connection attempt. Src is a pod on any node of the bed, or
// nil meaning "from the node netns itself" (the local node for Bed.Probe,
// node n for n.Probe). Dst is usually a pod IP; it may also be a node IP or
// a node's underlay IP, on any node.
type Probe struct {
	Src      *Pod
	Dst      netip.Addr
	Port     uint16
	Protocol Protocol
	// Timeout bounds this probe instead of the bed's Timeout when set: a last try of a probe
	// expected to pass can wait longer on a loaded machine.
	Timeout time.Duration
}

func (p Probe) String() string {
	src := "node"
	if p.Src != nil {
		src = p.Src.String()
	}
	return fmt.Sprintf("%s -> %s %s/%d", src, p.Dst, p.Protocol, p.Port)
}

// retransmit interval for UDP and SCTP probes
const resendEvery = 100 * time.Millisecond

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Probe reports whether a connection attempt succeeds within b.Timeout:
// TCP: connection established and a token echoed; UDP: a token echoed;
// SCTP: the receiver in the destination netns saw our INIT for one of its
// SCTP ports.
func (b *Bed) Probe(ctx context.Context, p Probe) bool {
	ok, _ := b.ProbeResult(ctx, p)
	return ok
}

// ProbeResult is Probe, also returning why a probe failed (for debugging).
// The error is nil iff the probe succeeded.
func (b *Bed) ProbeResult(ctx context.Context, p Probe) (bool, error) {
	return b.probe(ctx, b.local, p)
}

// probe runs p; a nil p.Src means node n.
func (b *Bed) probe(ctx context.Context, n *Node, p Probe) (bool, error) {
	timeout := b.Timeout
	if p.Timeout > 0 {
		timeout = p.Timeout
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	dst := p.Dst.Unmap()
	if !dst.IsValid() {
		return false, errors.New("invalid destination")
	}
	var src netip.Addr
	if p.Src == nil {
		src = n.NodeIP(family(dst))
	} else {
		src = p.Src.IP(family(dst))
	}
	if !src.IsValid() {
		return false, fmt.Errorf("source has no IPv%d address", family(dst))
	}
	ns, err := b.sourceNS(n, p.Src)
	if err != nil {
		return false, err
	}
	defer ns.Close()
	switch p.Protocol {
	case TCP:
		err = probeTCP(ctx, ns, src, netip.AddrPortFrom(dst, p.Port))
	case UDP:
		err = probeUDP(ctx, ns, src, netip.AddrPortFrom(dst, p.Port))
	case SCTP:
		err = b.probeSCTP(ctx, ns, src, dst, p.Port)
	default:
		err = fmt.Errorf("unknown protocol %q", p.Protocol)
	}
	return err == nil, err
}

// sourceNS returns a private duplicate of the source's netns handle (src, or
// node n if src is nil), so that a concurrent RemovePod/RemoveNode/Close
// cannot invalidate it mid-probe.
func (b *Bed) sourceNS(n *Node, src *Pod) (netns.NsHandle, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return netns.None(), errors.New("bed is closed")
	}
	h := n.ns
	if src != nil {
		h = src.ns
	}
	if !h.IsOpen() {
		return netns.None(), errors.New("source netns is gone")
	}
	fd, err := unix.FcntlInt(uintptr(h), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("dup netns handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// ProbeAll runs probes in parallel (at most b.Concurrency at a time) and
// returns result i for probe i.
func (b *Bed) ProbeAll(ctx context.Context, probes []Probe) []bool {
	errs := b.ProbeAllResults(ctx, probes)
	res := make([]bool, len(probes))
	for i, err := range errs {
		res[i] = err == nil
	}
	return res
}

// ProbeAllResults is ProbeAll returning, for each probe, nil on success or
// the reason it failed.
func (b *Bed) ProbeAllResults(ctx context.Context, probes []Probe) []error {
	return b.probeAll(ctx, b.local, probes)
}

func (b *Bed) probeAll(ctx context.Context, n *Node, probes []Probe) []error {
	res := make([]error, len(probes))
	conc := b.Concurrency
	if conc <= 0 {
		conc = DefaultConcurrency
	}
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i := range probes {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, res[i] = b.probe(ctx, n, probes[i])
		}()
	}
	wg.Wait()
	return res
}

func newToken() []byte {
	t := make([]byte, tokenLen)
	_, _ = rand.Read(t)
	return t
}

func probeTCP(ctx context.Context, ns netns.NsHandle, src netip.Addr, dst netip.AddrPort) error {
	deadline, _ := ctx.Deadline()
	var conn net.Conn
	// Two attempts: if the first SYN got lost somewhere (e.g. during neighbour
	// resolution) the kernel would only retransmit after 1s, beyond a typical
	// timeout. A fresh socket sends a fresh SYN right away.
	for attempt := 0; conn == nil; attempt++ {
		attemptDeadline := deadline
		if attempt == 0 {
			attemptDeadline = time.Now().Add(time.Until(deadline) * 6 / 10)
		}
		actx, cancel := context.WithDeadline(ctx, attemptDeadline)
		err := inNetNSGo(ns, func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
			c, err := d.DialContext(actx, "tcp", dst.String())
			conn = c
			return err
		})
		cancel()
		if err != nil {
			if attempt == 0 && ctx.Err() == nil && isTimeout(err) {
				continue
			}
			return err
		}
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	tok := newToken()
	if _, err := conn.Write(tok); err != nil {
		return err
	}
	got := make([]byte, tokenLen)
	if _, err := io.ReadFull(conn, got); err != nil {
		return err
	}
	if !bytes.Equal(got, tok) {
		return errors.New("echo mismatch")
	}
	return nil
}

func probeUDP(ctx context.Context, ns netns.NsHandle, src netip.Addr, dst netip.AddrPort) error {
	deadline, _ := ctx.Deadline()
	var conn *net.UDPConn
	err := inNetNSGo(ns, func() error {
		var err error
		conn, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	// Writes never block past the deadline (a socket whose packets sit in
	// an unresolved neighbour's queue can run out of send buffer).
	_ = conn.SetWriteDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	tok := newToken()
	buf := make([]byte, 1500)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if _, err := conn.Write(tok); err != nil {
			return err
		}
		next := time.Now().Add(resendEvery)
		if next.After(deadline) {
			next = deadline
		}
		_ = conn.SetReadDeadline(next)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				if errors.Is(err, syscall.ECONNREFUSED) {
					return err
				}
				if isTimeout(err) {
					break // resend
				}
				return err
			}
			if bytes.Equal(buf[:n], tok) {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

type sctpWaiter struct {
	dst  netip.Addr
	port uint16
	once sync.Once
	ch   chan struct{}
}

// sctpDeliver is called by every SCTP receiver for each INIT it sees.
func (b *Bed) sctpDeliver(dst netip.Addr, port uint16, nonce uint32) {
	if !b.sctpPorts[port] {
		return
	}
	b.sctpMu.Lock()
	w := b.sctpWaiters[nonce]
	b.sctpMu.Unlock()
	if w != nil && w.dst == dst && w.port == port {
		w.once.Do(func() { close(w.ch) })
	}
}

func (b *Bed) registerSCTP(dst netip.Addr, port uint16) (uint32, *sctpWaiter) {
	w := &sctpWaiter{dst: dst, port: port, ch: make(chan struct{})}
	b.sctpMu.Lock()
	defer b.sctpMu.Unlock()
	for {
		nonce := mrand.Uint32()
		if nonce == 0 || b.sctpWaiters[nonce] != nil {
			continue
		}
		b.sctpWaiters[nonce] = w
		return nonce, w
	}
}

func (b *Bed) probeSCTP(ctx context.Context, ns netns.NsHandle, src, dst netip.Addr, port uint16) error {
	network := "ip4:132"
	if dst.Is6() {
		network = "ip6:132"
	}
	var conn *net.IPConn
	err := inNetNSGo(ns, func() error {
		var err error
		// Binding the raw socket to src fixes the packet's source address.
		conn, err = net.DialIP(network, &net.IPAddr{IP: src.AsSlice()}, &net.IPAddr{IP: dst.AsSlice()})
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetWriteDeadline(deadline)

	nonce, w := b.registerSCTP(dst, port)
	defer func() {
		b.sctpMu.Lock()
		delete(b.sctpWaiters, nonce)
		b.sctpMu.Unlock()
	}()
	srcPort := uint16(32768 + mrand.IntN(28232))
	pkt := buildSCTPInit(srcPort, port, nonce, mrand.Uint32())
	t := time.NewTicker(resendEvery)
	defer t.Stop()
	for {
		if _, err := conn.Write(pkt); err != nil {
			return fmt.Errorf("send SCTP INIT: %w", err)
		}
		select {
		case <-w.ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
