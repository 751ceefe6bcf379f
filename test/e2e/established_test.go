package e2e

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
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/testbed"
)

// streamPort is where the server pod echoes long-lived streams (TCP) and datagrams (UDP); the
// test bed's own servers close a connection after one echo.
const streamPort = 7000

// TestEstablishedFlowsCut opens a TCP stream and a UDP flow from an allowed and from a denied
// client to a server, then applies a policy that admits only the allowed client, while all
// four flows carry a numbered message every 2 ms, each echoed back. Once the agent reports the
// policy applied, the denied client's flows get no echo at all; the allowed client's go on
// with every message echoed in order. Twenty rounds per backend, each with new flows (and
// the policy removed in between, which must let new flows through again), so a race with
// conntrack pickup would show. Then --keep-established keeps the denied flows going.
func TestEstablishedFlowsCut(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{nftablesBackend, iptablesNFT}, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", nil)
		w.addPod(t, "x", "srv", map[string]string{"app": "srv"})
		w.addPod(t, "x", "good", map[string]string{"role": "good"})
		w.addPod(t, "x", "bad", map[string]string{"role": "bad"})
		stop := serveStreams(t, w.tpods["x/srv"])
		defer stop()
		base := w.objects()
		if err := w.sim.SetState(base...); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.StartAgent(); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		deny := withIngress(netpol("x", "only-good", sel("app", "srv")), from(peers(podPeer(selp("role", "good")))))
		srv := netip.AddrPortFrom(w.tpods["x/srv"].IPv4, streamPort)
		round := func(t *testing.T, i int, keep bool) {
			good := openFlows(t, w.tpods["x/good"], srv)
			bad := openFlows(t, w.tpods["x/bad"], srv)
			defer good.close()
			defer bad.close()
			for _, f := range append(good.all(), bad.all()...) {
				f.waitEchoes(t, 3)
			}
			if err := w.sim.Apply(append(base, deny)...); err != nil {
				t.Fatal(err)
			}
			// The agent reports a change applied only after it re-judged the established
			// flows, so what is in flight now is the last that can pass: give it time to land.
			time.Sleep(50 * time.Millisecond)
			badBefore, goodBefore := bad.counts(), good.counts()
			time.Sleep(200 * time.Millisecond)
			badAfter, goodAfter := bad.counts(), good.counts()
			for k, f := range good.all() {
				if goodAfter[k] <= goodBefore[k] {
					t.Errorf("round %d: allowed %s flow stopped after the policy (echoes %d, then %d)", i, f.proto, goodBefore[k], goodAfter[k])
				}
				if err := f.failure(); err != nil {
					t.Errorf("round %d: allowed %s flow: %v", i, f.proto, err)
				}
			}
			for k, f := range bad.all() {
				switch {
				case keep && badAfter[k] <= badBefore[k]:
					t.Errorf("round %d: with --keep-established the denied %s flow stopped (echoes %d, then %d)", i, f.proto, badBefore[k], badAfter[k])
				case !keep && badAfter[k] != badBefore[k]:
					t.Errorf("round %d: denied %s flow still echoed after the policy applied (echoes %d, then %d)", i, f.proto, badBefore[k], badAfter[k])
				}
			}
			if err := w.sim.Apply(base...); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 20 {
			round(t, i, false)
			if t.Failed() {
				return
			}
		}
		if err := w.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.StartAgent("--keep-established"); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.WaitApplied(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		round(t, 0, true)
	})
}

// serveStreams echoes every TCP connection and UDP datagram to streamPort of pod p.
func serveStreams(t *testing.T, p *testbed.Pod) (stop func()) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	if err := p.InNetNSGo(func() error {
		var err error
		addr := netip.AddrPortFrom(p.IPv4, streamPort).String()
		if ln, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
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
	}
}

// flow sends a numbered 8-byte message every 2 ms over one connection and counts the echoes,
// which must come back in order with none missing.
type flow struct {
	proto   string
	conn    net.Conn
	echoes  atomic.Int64
	mu      sync.Mutex
	err     error
	stopped chan struct{}
	wg      sync.WaitGroup
}

type flowPair struct{ tcp, udp *flow }

func (fp flowPair) all() []*flow { return []*flow{fp.tcp, fp.udp} }

func (fp flowPair) counts() []int64 {
	return []int64{fp.tcp.echoes.Load(), fp.udp.echoes.Load()}
}

func (fp flowPair) close() {
	for _, f := range fp.all() {
		close(f.stopped)
		f.conn.Close()
		f.wg.Wait()
	}
}

func openFlows(t *testing.T, p *testbed.Pod, dst netip.AddrPort) flowPair {
	t.Helper()
	var fp flowPair
	if err := p.InNetNSGo(func() error {
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
		fp = flowPair{tcp: &flow{proto: "tcp", conn: tc}, udp: &flow{proto: "udp", conn: uc}}
		return nil
	}); err != nil {
		t.Fatalf("%s: opening flows to %s: %v", p, dst, err)
	}
	for _, f := range fp.all() {
		f.stopped = make(chan struct{})
		f.start()
	}
	return fp
}

func (f *flow) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *flow) failure() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *flow) start() {
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		var msg [8]byte
		for seq := uint64(0); ; seq++ {
			select {
			case <-f.stopped:
				return
			case <-tick.C:
			}
			binary.BigEndian.PutUint64(msg[:], seq)
			if f.proto == "tcp" {
				// A stream that the policy cut fills its send buffer and then blocks.
				_ = f.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			}
			if _, err := f.conn.Write(msg[:]); err != nil && !isClosedOrTimeout(err) {
				f.fail(fmt.Errorf("write: %w", err))
			}
		}
	}()
	go func() {
		defer f.wg.Done()
		var msg [8]byte
		for want := uint64(0); ; want++ {
			var err error
			if f.proto == "tcp" {
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
			f.echoes.Add(1)
		}
	}()
}

func (f *flow) waitEchoes(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.echoes.Load() < n {
		if err := f.failure(); err != nil {
			t.Fatalf("%s flow: %v", f.proto, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s flow: no echoes before the policy", f.proto)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func isClosedOrTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, net.ErrClosed) || errors.As(err, &ne) && ne.Timeout()
}
