package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

const dropLine = "packet dropped by policy"

// dropLines returns the agent's drop log lines that contain every one of want.
func dropLines(log string, want ...string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, dropLine) {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// metricsOf reads the agent's /metrics over its unix socket.
func metricsOf(t *testing.T, sock string) string {
	t.Helper()
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://agent/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricValue returns the value of the sample whose line starts with series, or 0.
func metricValue(metrics, series string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// inPod runs fn on a thread of its own in pod p's network namespace.
func inPod(t *testing.T, p *testbed.Pod, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread dies with its namespace switched: never unlocked
		h, err := netns.GetFromPath(p.NetNSPath())
		if err == nil {
			defer h.Close()
			err = netns.Set(h)
		}
		if err == nil {
			err = fn()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// connectOnce makes one TCP connection attempt from pod src, long enough for the kernel to
// send its SYN again (after 1 s): one attempt, two packets. It reports whether it connected.
func connectOnce(t *testing.T, src *testbed.Pod, dst netip.AddrPort) bool {
	t.Helper()
	ok := false
	inPod(t, src, func() error {
		c, err := net.DialTimeout("tcp", dst.String(), 1500*time.Millisecond)
		if err == nil {
			ok = true
			c.Close()
		}
		return nil
	})
	return ok
}

// sumMetric adds up the samples of metric whose labels include every one of labels.
func sumMetric(metrics, metric string, labels ...string) float64 {
	sum := 0.0
	for _, l := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(l, metric+"{") {
			continue
		}
		ok := true
		for _, lb := range labels {
			ok = ok && strings.Contains(l, lb)
		}
		if ok {
			f, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			sum += f
		}
	}
	return sum
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// sendUDP sends n datagrams from pod src to dst, each from a socket of its own and so from a
// port of its own: n connection attempts, each new to conntrack.
func sendUDP(t *testing.T, src *testbed.Pod, dst netip.AddrPort, n int) {
	t.Helper()
	inPod(t, src, func() error {
		for i := 0; i < n; i++ {
			c, err := net.Dial("udp", dst.String())
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("flood"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// TestDropLogging proves --log-drops on each backend with packets crossing the node: a denied
// probe gives exactly one line naming both pods and the policy and moves the counter, an
// allowed probe gives none, and a flood of denied attempts logs no more than the kernel limit
// lets through.
func TestDropLogging(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, false)
		w.addNamespace("x", map[string]string{"ns": "x"})
		w.addPod(t, "x", "server", map[string]string{"app": "server"}, cport("web", 80, tcp))
		w.addPod(t, "x", "friend", map[string]string{"app": "friend"})
		w.addPod(t, "x", "stranger", map[string]string{"app": "stranger"})
		w.addPod(t, "x", "marker", map[string]string{"app": "marker"})
		w.policies["x/web"] = withIngress(netpol("x", "web", sel("app", "server")), from(peers(podPeer(selp("app", "friend"))), port(tcp, 80)))
		// A rate of one a second with a burst of 3: the flood below sends far more in the time
		// it takes, so the bound is tight enough to fail.
		const rate, burst = 1, 3
		flags := []string{"--log-drops", "--log-drops-rate", strconv.Itoa(rate), "--log-drops-burst", strconv.Itoa(burst), "--log-drops-group", "33"}
		if !be.iptables() {
			flags = append(flags, "--policy-counters")
		}
		if err := w.sim.StartAgent(flags...); err != nil {
			t.Fatal(err)
		}
		w.apply(t)
		ctx := context.Background()
		bed := w.sim.Bed
		server := w.tpods["x/server"]
		dst := server.IPv4
		allowed := testbed.Probe{Src: w.tpods["x/friend"], Dst: dst, Port: 80, Protocol: testbed.TCP}
		denied := testbed.Probe{Src: w.tpods["x/stranger"], Dst: dst, Port: 80, Protocol: testbed.TCP}
		marker := testbed.Probe{Src: w.tpods["x/marker"], Dst: dst, Port: 80, Protocol: testbed.TCP}
		if !bed.Probe(ctx, allowed) {
			t.Fatalf("%v: denied, want allowed", allowed)
		}
		// One attempt whose SYN the kernel sends twice: one line.
		if connectOnce(t, denied.Src, netip.AddrPortFrom(dst, 80)) {
			t.Fatalf("%v: allowed, want denied", denied)
		}
		if !bed.Probe(ctx, allowed) {
			t.Fatalf("%v: denied, want allowed", allowed)
		}
		// The kernel logs in order and the agent reads in order: once the marker's line is
		// there, every line of the probes before it is too.
		if bed.Probe(ctx, marker) {
			t.Fatalf("%v: allowed, want denied", marker)
		}
		waitFor(t, 10*time.Second, "the marker probe's drop line", func() bool {
			return len(dropLines(w.sim.Log(), "src=x/marker")) > 0
		})
		log := w.sim.Log()
		got := dropLines(log, "src=x/stranger", "dst=x/server")
		if len(got) != 1 {
			t.Fatalf("denied probe: %d drop lines, want 1:\n%s", len(got), strings.Join(dropLines(log), "\n"))
		}
		for _, want := range []string{"direction=ingress", "proto=tcp", "port=80", "policies=x/web", `reason="isolated by x/web; no rule admits"`,
			"srcIP=" + denied.Src.IPv4.String(), "dstIP=" + dst.String()} {
			if !strings.Contains(got[0], want) {
				t.Errorf("drop line lacks %s: %s", want, got[0])
			}
		}
		if n := len(dropLines(log, "src=x/friend")); n != 0 {
			t.Errorf("allowed probe: %d drop lines, want none", n)
		}
		series := `netwarden_dropped_packets_total{direction="ingress",namespace="x",policy="web"}`
		before := metricValue(metricsOf(t, w.sim.StatusSocket()), series)
		if before < 3 {
			t.Fatalf("%s = %v after three denied SYNs, want at least 3", series, before)
		}

		if !be.iptables() {
			m := metricsOf(t, w.sim.StatusSocket())
			// Three allowed connections (the probe may try twice), and three denied SYNs.
			accepted := sumMetric(m, "netwarden_policy_packets_total", `kind="NetworkPolicy"`, `namespace="x"`, `policy="web"`, `direction="ingress"`, `verdict="accept"`)
			dropped := sumMetric(m, "netwarden_policy_packets_total", `kind="NetworkPolicy"`, `namespace="x"`, `policy="web"`, `direction="ingress"`, `verdict="drop"`)
			if accepted < 2 || dropped < 3 {
				t.Errorf("policy counters: %v accepted, %v dropped; want at least 2 and 3:\n%s", accepted, dropped, grepLines(m, "netwarden_policy_packets_total"))
			}
		}

		// The flood: attempts from new ports, each a new connection. The kernel lets through
		// at most the burst and then rate a second, whatever the reader could take.
		const flood = 2000
		start := time.Now()
		sendUDP(t, w.tpods["x/stranger"], netip.AddrPortFrom(dst, 80), flood)
		// The flood spent the limiter's tokens, which the marker needs too: it tries until one
		// is back.
		waitFor(t, 15*time.Second, "a marker datagram's drop line", func() bool {
			sendUDP(t, w.tpods["x/marker"], netip.AddrPortFrom(dst, 9), 1)
			time.Sleep(100 * time.Millisecond)
			return len(dropLines(w.sim.Log(), "src=x/marker", "proto=udp")) > 0
		})
		elapsed := time.Since(start)
		// The limiter may have refilled fully before the flood.
		bound := burst + int(elapsed.Seconds()*rate)
		logged := len(dropLines(w.sim.Log(), "src=x/stranger", "proto=udp"))
		t.Logf("flood: %d datagrams sent in %v, %d logged (bound %d)", flood, elapsed.Round(time.Millisecond), logged, bound)
		if logged < 1 || logged > bound {
			t.Fatalf("flood of %d: %d lines logged, want 1 to %d (burst %d, then %d a second over %v)", flood, logged, bound, burst, rate, elapsed)
		}
		if flood <= 10*bound {
			t.Fatalf("the flood took %v, so long that its bound (%d) says little; send more", elapsed, bound)
		}
		after := metricValue(metricsOf(t, w.sim.StatusSocket()), series)
		markers := len(dropLines(w.sim.Log(), "src=x/marker", "proto=udp"))
		if after-before != float64(logged+markers) {
			t.Errorf("%s moved by %v over the flood, want %d (its lines and the markers')", series, after-before, logged+markers)
		}

		// A ClusterNetworkPolicy Deny rule names the policy and the rule, and the direction
		// it judged; it drops before NetworkPolicy admits.
		cnp := &npav1beta1.ClusterNetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: "fence"},
			Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 1,
				Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{
					NamespaceSelector: metav1.LabelSelector{}, PodSelector: sel("app", "friend")}},
				Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Name: "no-server", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
					To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Pods: &npav1beta1.NamespacedPod{NamespaceSelector: metav1.LabelSelector{}, PodSelector: sel("app", "server")}}}}}},
		}
		if err := w.sim.Apply(append(w.objects(), cnp)...); err != nil {
			t.Fatal(err)
		}
		if err := w.sim.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		if connectOnce(t, allowed.Src, netip.AddrPortFrom(dst, 80)) {
			t.Fatalf("%v: allowed, want denied by the ClusterNetworkPolicy", allowed)
		}
		waitFor(t, 10*time.Second, "the ClusterNetworkPolicy drop line", func() bool {
			return len(dropLines(w.sim.Log(), "src=x/friend")) > 0
		})
		got = dropLines(w.sim.Log(), "src=x/friend")
		for _, want := range []string{"direction=egress", "dst=x/server", "port=80", "clusterPolicy=fence", "rule=no-server",
			`reason="denied by admin ClusterNetworkPolicy fence rule no-server"`} {
			if !strings.Contains(got[0], want) {
				t.Errorf("drop line lacks %s: %s", want, got[0])
			}
		}
		m := metricsOf(t, w.sim.StatusSocket())
		if cs := `netwarden_dropped_packets_total{direction="egress",namespace="",policy="fence"}`; metricValue(m, cs) < 1 {
			t.Errorf("%s did not move", cs)
		}
		if !be.iptables() {
			if n := sumMetric(m, "netwarden_policy_packets_total", `kind="ClusterNetworkPolicy"`, `policy="fence"`, `direction="egress"`, `verdict="drop"`); n < 1 {
				t.Errorf("policy counter of the ClusterNetworkPolicy's deny: %v, want at least 1:\n%s", n, grepLines(m, "netwarden_policy_packets_total"))
			}
		}

		// explain --kernel agrees with the kernel the agent programmed, and says so loudly
		// once the kernel stops holding a fact the verdict depends on. The agent is stopped
		// first, so that no resync repairs the change before explain looks.
		if err := w.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		explainArgs := []string{"explain", "--kernel", "--manifests", w.sim.Dir, "--node-name", w.sim.NodeName,
			"--from", "x/stranger", "--to", "x/server", "--port", "80/tcp"}
		out, err := w.sim.RunAgent(ctx, explainArgs...)
		if err != nil || strings.Contains(out, "KERNEL MISMATCH") || !strings.Contains(out, "kernel: agrees") {
			t.Fatalf("explain --kernel on an agreeing kernel: %v\n%s", err, out)
		}
		dispatched, mismatch := "maps "+dst.String()+" to jump grp-ingress-", "KERNEL MISMATCH: want: map dispatch-in-v4 maps "+dst.String()
		if be.iptables() {
			dispatched = "chain NETWARDEN-INGRESS leads " + dst.String() + " to NETWARDEN-G-"
			mismatch = "KERNEL MISMATCH: want: " + dispatched
		}
		if !strings.Contains(out, "set ") || !strings.Contains(out, dispatched) {
			t.Errorf("explain --kernel did not check the server's dispatch and the peer sets:\n%s", out)
		}
		deleteDispatch(t, w, be, dst.String())
		out, err = w.sim.RunAgent(ctx, explainArgs...)
		if err == nil || !strings.Contains(out, mismatch) {
			t.Fatalf("explain --kernel with the server's dispatch element gone: %v, want a mismatch and an error:\n%s", err, out)
		}
	})
}
