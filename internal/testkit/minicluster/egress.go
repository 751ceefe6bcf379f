package minicluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// The API server's way to the nodes. The API server runs on the loopback of the namespace the
// cluster is started from, and the kubelets listen on the nodes' underlay addresses, which that
// namespace has no route to (and must not get one). So, as in a cluster whose control plane is
// cut off from its nodes, the API server's "cluster" egress (exec, logs, port-forward, the proxy
// subresources) goes through an HTTP CONNECT proxy, as Konnectivity does: this one listens on a
// unix socket and dials from the underlay namespace.

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

func startEgressProxy(socket string, dial func(ctx context.Context, addr string) (net.Conn, error)) (*testbed.Forwarder, error) {
	os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	return testbed.Relay(ln, func(in net.Conn) (io.Reader, net.Conn, error) { return connect(in, dial) }), nil
}

// connect answers the CONNECT request that starts each connection of the API server. What the
// API server sent after its request is already in the returned reader's buffer.
func connect(in net.Conn, dial func(ctx context.Context, addr string) (net.Conn, error)) (io.Reader, net.Conn, error) {
	br := bufio.NewReader(in)
	in.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	in.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(in, "HTTP/1.1 405 Method Not Allowed\r\n\r\nonly CONNECT\n")
		return nil, nil, errors.New("not a CONNECT request")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	out, err := dial(ctx, req.Host)
	cancel()
	if err != nil {
		fmt.Fprintf(in, "HTTP/1.1 502 Bad Gateway\r\n\r\n%v\n", err)
		return nil, nil, err
	}
	if _, err := io.WriteString(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		out.Close()
		return nil, nil, err
	}
	return br, out, nil
}
