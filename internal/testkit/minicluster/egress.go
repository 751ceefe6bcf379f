package minicluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// egressProxy is the API server's way to the nodes. The API server runs on the loopback of the
// namespace the cluster is started from, and the kubelets listen on the nodes' underlay
// addresses, which that namespace has no route to (and must not get one). So, as in a cluster
// whose control plane is cut off from its nodes, the API server's "cluster" egress (exec, logs,
// port-forward, the proxy subresources) goes through an HTTP CONNECT proxy, as Konnectivity
// does: this one listens on a unix socket and dials from the underlay namespace.
type egressProxy struct {
	ln    net.Listener
	dial  func(ctx context.Context, addr string) (net.Conn, error)
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// egressSelectorConfig is the kube-apiserver --egress-selector-config-file that sends the
// cluster egress through the proxy on socket.
func egressSelectorConfig(socket string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, socket)
}

func startEgressProxy(socket string, dial func(ctx context.Context, addr string) (net.Conn, error)) (*egressProxy, error) {
	os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	p := &egressProxy{ln: ln, dial: dial, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.track(c) {
				c.Close()
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.untrack(c)
				p.serve(c)
			}()
		}
	}()
	return p, nil
}

func (p *egressProxy) serve(in net.Conn) {
	defer in.Close()
	br := bufio.NewReader(in)
	in.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	in.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(in, "HTTP/1.1 405 Method Not Allowed\r\n\r\nonly CONNECT\n")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	out, err := p.dial(ctx, req.Host)
	cancel()
	if err != nil {
		fmt.Fprintf(in, "HTTP/1.1 502 Bad Gateway\r\n\r\n%v\n", err)
		return
	}
	if !p.track(out) {
		out.Close()
		return
	}
	defer p.untrack(out)
	defer out.Close()
	if _, err := io.WriteString(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// What the client sent after its request line is already in br's buffer.
		io.Copy(out, br)
		done <- struct{}{}
	}()
	go func() { io.Copy(in, out); done <- struct{}{} }()
	<-done
	in.Close()
	out.Close()
	<-done
}

func (p *egressProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *egressProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *egressProxy) Close() error {
	p.mu.Lock()
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
