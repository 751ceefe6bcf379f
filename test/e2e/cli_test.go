package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// denyWorld is a namespace x with pods a and b, a denied all ingress, written to the manifests
// but with no agent running.
func denyWorld(t *testing.T, be backend, v6 bool) *world {
	t.Helper()
	w := newWorld(t, be, testbed.Routed, true, v6)
	w.addNamespace("x", map[string]string{"ns": "x"})
	w.addPod(t, "x", "a", map[string]string{"pod": "a"})
	w.addPod(t, "x", "b", map[string]string{"pod": "b"})
	w.policies["x/deny"] = netpol("x", "deny", sel("pod", "a"))
	if err := w.sim.SetState(w.objects()...); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestCommands covers render, agent --once, cleanup and flag errors with the real binary.
func TestCommands(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := denyWorld(t, be, false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		blocked := func() bool { return !tcpProbe(w, "x/b", "x/a", 80) }
		open := func() bool { return tcpOpen(w, "x/b", "x/a", 80) }
		state := []string{"--manifests", w.sim.Dir, "--node-name", w.sim.NodeName}

		out, err := w.sim.RunAgent(ctx, append([]string{"render"}, state...)...)
		want := "add table inet netwarden"
		if be.iptables() {
			want = "-A NETWARDEN-FORWARD -j NETWARDEN-EGRESS"
		}
		if err != nil || !strings.Contains(out, "/x/deny") || !strings.Contains(out, want) {
			t.Fatalf("render: %v\n%s", err, out)
		}
		if left := ourObjects(ctx, t, w.sim.Bed); len(left) > 0 {
			t.Fatalf("render touched the kernel: %v", left)
		}
		if !open() {
			t.Fatal("traffic blocked before any agent ran")
		}

		out, err = w.sim.RunAgent(ctx, append([]string{"agent", "--once", "--health-addr", ""}, state...)...)
		if err != nil {
			t.Fatalf("agent --once: %v\n%s", err, out)
		}
		if !blocked() {
			t.Fatal("agent --once did not enforce the policy")
		}

		// Turning NetworkPolicy off removes our rules rather than leaving them enforcing.
		out, err = w.sim.RunAgent(ctx, append([]string{"agent", "--once", "--health-addr", "", "--network-policy=false"}, state...)...)
		if err != nil {
			t.Fatalf("agent --network-policy=false: %v\n%s", err, out)
		}
		if !open() {
			t.Fatal("--network-policy=false left the policy enforced")
		}
		if out, err := w.sim.RunAgent(ctx, append([]string{"agent", "--once", "--health-addr", ""}, state...)...); err != nil || !blocked() {
			t.Fatalf("agent --once again: %v\n%s", err, out)
		}

		out, err = w.sim.RunAgent(ctx, "cleanup")
		if err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		if left := ourObjects(ctx, t, w.sim.Bed); len(left) > 0 {
			t.Fatalf("cleanup left:\n%s", strings.Join(left, "\n"))
		}
		if !open() {
			t.Fatal("traffic still blocked after cleanup")
		}
		if out, err := w.sim.RunAgent(ctx, "cleanup"); err != nil {
			t.Fatalf("second cleanup must succeed: %v\n%s", err, out)
		}

		for _, bad := range []struct {
			args []string
			want string
		}{
			{[]string{"agent", "--once", "--manifests", "/nonexistent/dir"}, "/nonexistent/dir"},
			{[]string{"agent", "--once", "--manifests", w.sim.Dir, "--kubeconfig", "/tmp/kc"}, "mutually exclusive"},
			{[]string{"agent", "--once", "--manifests", w.sim.Dir, "--backend", "bogus"}, `--backend "bogus"`},
			{[]string{"agent", "--once", "--manifests", w.sim.Dir, "--log-level", "loud"}, "--log-level"},
			{[]string{"render", "--node-name", "n"}, "--manifests"},
		} {
			out, err := w.sim.RunAgent(ctx, bad.args...)
			if err == nil || !strings.Contains(out, bad.want) {
				t.Errorf("%v: want an error mentioning %q, got err=%v:\n%s", bad.args, bad.want, err, out)
			}
		}
		if out, err := w.sim.RunAgent(ctx, "version"); err != nil || !strings.HasPrefix(out, "netwarden ") {
			t.Errorf("version: %v %q", err, out)
		}
	})
}

// TestHealthAndMetrics checks /healthz, /readyz and /metrics on the agent's health address.
func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addPod(t, "x", "a", map[string]string{"pod": "a"})
		w.addPod(t, "x", "b", map[string]string{"pod": "b"})
		w.policies["x/deny"] = netpol("x", "deny", sel("pod", "a"))
		if err := w.sim.SetState(w.objects()...); err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:9491"
		if err := w.sim.StartAgent("--health-addr", addr); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "readyz 200", func() bool { status, _ := httpGet(w, addr, "/readyz"); return status == http.StatusOK })
		if status, _ := httpGet(w, addr, "/healthz"); status != http.StatusOK {
			t.Fatalf("/healthz = %d", status)
		}
		// A change after ready gives the programming-latency histogram a sample.
		w.pods["x/b"].Labels["pod"] = "a"
		w.apply(t)
		wants := []string{
			`netwarden_sync_duration_seconds_count{backend="` + be.name + `",sync="full"} 1`,
			`netwarden_sync_duration_seconds_count{backend="` + be.name + `",sync="partial"}`,
			`netwarden_programming_latency_seconds_count`,
			`netwarden_sync_errors_total`,
			`netwarden_backend_info{backend="` + be.name + `",feature="network-policy"} 1`,
			`netwarden_local_pods 2`,
			`netwarden_local_pods_selected 2`,
			`netwarden_policies_selecting_local_pods 1`,
			`netwarden_policies_skipped 0`,
			`netwarden_kernel_objects{backend="` + be.name + `",kind="chains"}`,
		}
		// apply waited for the status to report the written state applied, so the metrics of
		// that sync are there now.
		status, body := httpGet(w, addr, "/metrics")
		var missing []string
		for _, want := range wants {
			if !strings.Contains(body, want) {
				missing = append(missing, want)
			}
		}
		if status != http.StatusOK {
			t.Fatalf("/metrics = %d", status)
		}
		for _, want := range missing {
			t.Errorf("/metrics lacks %q", want)
		}
		if strings.Contains(body, `netwarden_programming_latency_seconds_count 0`) {
			t.Error("programming latency has no sample after a change")
		}

		// The applied generation is one fact in three places: /status, the metric and the
		// "synced" log line.
		st, err := w.sim.Status()
		if err != nil || st.NetworkPolicy == nil || st.NetworkPolicy.Generation == 0 || !st.Ready {
			t.Fatalf("/status: %+v, %v", st, err)
		}
		gen := st.NetworkPolicy.Generation
		if want := fmt.Sprintf(`netwarden_applied_generation{feature="network-policy"} %d`, gen); !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
		if want := fmt.Sprintf("msg=synced backend=%s generation=%d ", be.name, gen); w.sim.WaitLogged(10*time.Second, want) != "" {
			t.Errorf("no %q in the log:\n%s", want, tail(w.sim.Log(), 10))
		}
		if got, _ := st.NetworkPolicy.Revision.Files.Get("cluster.yaml"); got != w.sim.Written()["cluster.yaml"] || got == "" {
			t.Errorf("/status names cluster.yaml content %q, want the hash of what was written", got)
		}
		if st.Masquerade == nil || st.Masquerade.Generation == 0 || st.Masquerade.Revision.Files.Map()["cluster.yaml"] != w.sim.Written()["cluster.yaml"] {
			t.Errorf("/status of masquerade: %+v", st.Masquerade)
		}
	})
}

// httpGet issues a GET inside the node netns, where the agent listens on loopback.
func httpGet(w *world, addr, path string) (int, string) {
	status, body := 0, ""
	_ = w.sim.Bed.InNode(func() error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return nil
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			status = resp.StatusCode
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			resp.Body.Close()
		}
		return nil
	})
	return status, body
}
