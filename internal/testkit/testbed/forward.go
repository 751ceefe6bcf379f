package testbed

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Forwarder is a TCP listener inside a node's netns whose connections are relayed to the same
// address in the caller's (the test process's) network namespace, or any listener served by
// Relay. Close stops it and cuts the connections it relays.
type Forwarder struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// ForwardLoopback makes addr (host:port, normally on loopback) inside n's netns reach the same
// address in the namespace of the test process, so that processes in the node netns (an agent,
// kube-proxy) can talk to a kube-apiserver the test runs on 127.0.0.1. Nothing is configured
// in either namespace: it is a listening socket made in the node netns and a relay in the test
// process.
func (n *Node) ForwardLoopback(addr string) (*Forwarder, error) { return n.Forward(addr, addr) }

// Forward listens on listen (host:port; port 0 picks a free one, see Addr) inside n's netns and
// relays each connection to target, dialled from the namespace of the test process.
func (n *Node) Forward(listen, target string) (*Forwarder, error) {
	return NewForwarder(n.InNetNSGo, n.NetNSName, listen, target)
}

// NewForwarder is Forward for any network namespace: inNetNS runs its function inside it (the
// namespace is named nsName in errors).
func NewForwarder(inNetNS func(func() error) error, nsName, listen, target string) (*Forwarder, error) {
	var ln net.Listener
	if err := inNetNS(func() error {
		var err error
		ln, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		return nil, fmt.Errorf("testbed: listening on %s in %s: %w", listen, nsName, err)
	}
	return Relay(ln, func(in net.Conn) (io.Reader, net.Conn, error) {
		out, err := net.DialTimeout("tcp", target, 5*time.Second)
		return in, out, err
	}), nil
}

// Relay serves ln: for each connection accepted, connect opens the connection to relay it to
// (and says what to read from the accepted one: the connection itself, or a reader that has
// buffered the start of it), then the two are copied both ways until either side ends. A
// connect error closes the accepted connection. Close stops it.
func Relay(ln net.Listener, connect func(in net.Conn) (io.Reader, net.Conn, error)) *Forwarder {
	f := &Forwarder{ln: ln, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			if !f.track(in) {
				in.Close()
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer f.untrack(in)
				src, out, err := connect(in)
				if err != nil {
					in.Close()
					return
				}
				if !f.track(out) {
					in.Close()
					out.Close()
					return
				}
				defer f.untrack(out)
				done := make(chan struct{}, 2)
				go func() { io.Copy(out, src); done <- struct{}{} }()
				go func() { io.Copy(in, out); done <- struct{}{} }()
				<-done
				in.Close()
				out.Close()
				<-done
			}()
		}
	}()
	return f
}

// Addr is the address the forwarder listens on inside the node netns.
func (f *Forwarder) Addr() net.Addr { return f.ln.Addr() }

func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// Close stops listening, closes every relayed connection and waits for the relays to end.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	f.done = true
	err := f.ln.Close()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}
