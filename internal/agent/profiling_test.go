package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
)

// TestProfilingOnlyWhenAsked checks that Go's profiles are served on the health address with
// Profiling, and not without.
func TestProfilingOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		sock := filepath.Join(t.TempDir(), "health.sock")
		a := New(Config{NodeName: "n", Source: &runningSource{state: cluster.NewState()}, HealthAddr: "unix:" + sock, Profiling: on})
		ctx, cancel := context.WithCancel(context.Background())
		if err := a.serveHealth(ctx); err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
		for path, want := range map[string]int{"/healthz": 200, "/debug/pprof/heap": map[bool]int{false: 404, true: 200}[on]} {
			resp, err := client.Get("http://agent" + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want || want == 200 && len(body) == 0 {
				t.Errorf("profiling %v: GET %s = %d with %d bytes, want %d", on, path, resp.StatusCode, len(body), want)
			}
		}
		cancel()
	}
}
