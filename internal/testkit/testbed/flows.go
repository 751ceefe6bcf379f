package testbed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ServeEcho echoes every TCP stream and UDP datagram to port on the pod's IPv4 address, for
// as long as the peer keeps sending (the bed's own servers close after one echo).
func (p *Pod) ServeEcho(port uint16) (stop func(), err error) {
	var ln net.Listener
	var pc net.PacketConn
	if err := p.InNetNSGo(func() error {
		var err error
		addr := netip.AddrPortFrom(p.IPv4, port).String()
		if ln, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		if pc, err = net.ListenPacket("udp", addr); err != nil {
			ln.Close()
		}
		return err
	}); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	return func() {
		ln.Close()
		pc.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}, nil
}

// Flow sends a numbered 8-byte message every 2 ms over one TCP stream or UDP socket and counts
// the echoes, which must come back in order with none missing.
type Flow struct {
	Proto   string // "tcp" or "udp"
	conn    net.Conn
	echoes  atomic.Int64
	sent    atomic.Int64 // messages handed to the kernel whole
	last    atomic.Int64 // unix nanoseconds of the last echo
	mu      sync.Mutex
	err     error
	stopped chan struct{}
	wg      sync.WaitGroup
}

// OpenFlows opens a TCP and a UDP flow from pod p to dst and starts them.
func OpenFlows(p *Pod, dst netip.AddrPort) (tcp, udp *Flow, err error) {
	err = p.InNetNSGo(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var d net.Dialer
		tc, err := d.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return err
		}
		uc, err := d.DialContext(ctx, "udp", dst.String())
		if err != nil {
			tc.Close()
			return err
		}
		tcp, udp = &Flow{Proto: "tcp", conn: tc}, &Flow{Proto: "udp", conn: uc}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: opening flows to %s: %w", p, dst, err)
	}
	tcp.start()
	udp.start()
	return tcp, udp, nil
}

// Echoes counts the messages echoed so far. Echoes come back in order, so Echoes() > n means
// that message n (counting from 0) was echoed.
func (f *Flow) Echoes() int64 { return f.echoes.Load() }

// Sent counts the messages written so far: a message numbered Sent() or later is written
// after the call, however late its echo is read.
func (f *Flow) Sent() int64 { return f.sent.Load() }

// LastEcho is when the last echo arrived (zero before the first).
func (f *Flow) LastEcho() time.Time {
	if n := f.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Err reports a lost or reordered echo, or a broken connection.
func (f *Flow) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// WaitEchoes waits until n echoes came back.
func (f *Flow) WaitEchoes(n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for f.echoes.Load() < n {
		if err := f.Err(); err != nil {
			return fmt.Errorf("%s flow: %w", f.Proto, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s flow: %d echoes in %v, want %d", f.Proto, f.echoes.Load(), timeout, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// Close stops the flow.
func (f *Flow) Close() {
	close(f.stopped)
	f.conn.Close()
	f.wg.Wait()
}

func (f *Flow) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *Flow) start() {
	f.stopped = make(chan struct{})
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		var msg [8]byte
		for seq := uint64(0); ; {
			select {
			case <-f.stopped:
				return
			case <-tick.C:
			}
			binary.BigEndian.PutUint64(msg[:], seq)
			if f.Proto == "tcp" {
				// A stream that a policy cut fills its send buffer and then blocks.
				_ = f.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			}
			// Counted before the write: a message counts as sent from the moment it may be.
			f.sent.Store(int64(seq + 1))
			if n, err := f.conn.Write(msg[:]); err != nil {
				if !closedOrTimeout(err) {
					f.fail(fmt.Errorf("write: %w", err))
				}
				if n > 0 {
					return // a message cut short: the stream's framing is lost
				}
				f.sent.Store(int64(seq)) // not written: the same message goes next time
				continue
			}
			seq++
		}
	}()
	go func() {
		defer f.wg.Done()
		var msg [8]byte
		for want := uint64(0); ; want++ {
			var err error
			if f.Proto == "tcp" {
				_, err = io.ReadFull(f.conn, msg[:])
			} else {
				var n int
				if n, err = f.conn.Read(msg[:]); err == nil && n != 8 {
					err = fmt.Errorf("echo of %d bytes", n)
				}
			}
			if err != nil {
				select {
				case <-f.stopped:
				default:
					f.fail(fmt.Errorf("read: %w", err))
				}
				return
			}
			if got := binary.BigEndian.Uint64(msg[:]); got != want {
				f.fail(fmt.Errorf("echo %d came back where %d was due: a message was lost", got, want))
				return
			}
			f.last.Store(time.Now().UnixNano())
			f.echoes.Add(1)
		}
	}()
}

func closedOrTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, net.ErrClosed) || errors.As(err, &ne) && ne.Timeout()
}
