package testbed

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"time"
)

// HTTPGet reads http://addr/path from inside a network namespace: inNetNS runs its function
// there (Node.InNetNSGo, or a kit's own), so that a server listening on that namespace's
// loopback (a health endpoint) can be read from the test's. It returns the body and status.
func HTTPGet(ctx context.Context, inNetNS func(func() error) error, addr, path string) ([]byte, int, error) {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var conn net.Conn
			err := inNetNS(func() error {
				var d net.Dialer
				var err error
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return buf.Bytes(), resp.StatusCode, err
}
