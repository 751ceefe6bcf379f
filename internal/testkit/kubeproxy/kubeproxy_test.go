package kubeproxy_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/kubeproxy"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// rootState prints what kube-proxy could change outside its netns, from the test's own (root)
// network namespace: the whole nftables ruleset, both iptables variants' tables, routes, links
// and addresses, the conntrack sysctls and the global conntrack hash size, and whether ip_vs is
// loaded. Counters are left out.
func rootState(t *testing.T) string {
	t.Helper()
	counters := regexp.MustCompile(`\[\d+:\d+\]|counter packets \d+ bytes \d+`)
	var sb strings.Builder
	for _, c := range [][]string{
		{"nft", "list", "ruleset"},
		{"iptables-nft-save"}, {"ip6tables-nft-save"},
		{"iptables-legacy-save"}, {"ip6tables-legacy-save"},
		{"ip", "-d", "route", "show", "table", "all"},
		{"ip", "-6", "-d", "route", "show", "table", "all"},
		{"ip", "-d", "link", "show"},
		{"ip", "addr", "show"},
		{"sh", "-c", "for f in /proc/sys/net/netfilter/nf_conntrack_max /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established " +
			"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait /proc/sys/net/netfilter/nf_conntrack_udp_timeout " +
			"/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream /proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal " +
			"/proc/sys/net/ipv4/conf/all/route_localnet /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/vs/conntrack " +
			"/sys/module/nf_conntrack/parameters/hashsize; do echo \"$f=$(cat $f 2>/dev/null)\"; done; " +
			"test -d /sys/module/ip_vs && echo ip_vs loaded || echo ip_vs not loaded"},
	} {
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		if err != nil {
			t.Logf("root state: %v: %v", c, err)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "#") { // iptables-save's dated comments
				continue
			}
			lines = append(lines, counters.ReplaceAllString(l, ""))
		}
		sb.WriteString("$ " + strings.Join(c, " ") + "\n" + strings.Join(lines, "\n") + "\n")
	}
	return sb.String()
}

// TestKubeProxyInNetNS runs kube-proxy in both modes inside a node netns against a real API
// server: Services reach their endpoints (pod to ClusterIP, NodePort from the node), the waits
// see the rules, Restart, Stop and Kill work, and nothing in the root network namespace changes.
func TestKubeProxyInNetNS(t *testing.T) {
	kerneltest.Require(t)
	srv := kubetest.Start(t, kubetest.Options{ExtraAPIServerArgs: []string{"--service-cluster-ip-range=" + kubetest.DualStackServiceRange}})
	before := rootState(t)
	for _, mode := range []kubeproxy.Mode{kubeproxy.NFTables, kubeproxy.IPTables} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			testMode(t, srv, mode)
		})
	}
	t.Run("ipvs", func(t *testing.T) {
		// ipvs is a value the kit knows, and refuses where it would have to load ip_vs.
		if _, err := os.Stat("/sys/module/ip_vs"); err == nil {
			t.Skip("ip_vs is loaded here: nothing to refuse")
		}
		bed, err := testbed.New(testbed.Config{IPv4: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { bed.Close() })
		p := kubeproxy.New(t, kubeproxy.Options{Node: bed.LocalNode(), NodeName: "ipvs-node", Server: srv, Mode: kubeproxy.IPVS})
		if err := p.Start(); err == nil || !strings.Contains(err.Error(), "unsupported") {
			t.Fatalf("Start in ipvs mode without ip_vs: %v, want ErrUnsupported", err)
		}
	})
	t.Cleanup(func() {
		// After the subtests (and their kube-proxies) are done.
		if after := rootState(t); after != before {
			t.Errorf("the root network namespace changed while kube-proxy ran in node namespaces:\n--- before\n%s\n--- after\n%s", before, after)
		}
	})
}

func testMode(t *testing.T, srv *kubetest.Server, mode kubeproxy.Mode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := srv.AdminClient(t)
	// Each mode its own node name, namespace and pod CIDRs: both share the API server.
	v4 := map[kubeproxy.Mode]string{kubeproxy.NFTables: "10.244.8.0/24", kubeproxy.IPTables: "10.244.9.0/24"}[mode]
	v6 := map[kubeproxy.Mode]string{kubeproxy.NFTables: "fd00:10:244:8::/64", kubeproxy.IPTables: "fd00:10:244:9::/64"}[mode]
	bed, err := testbed.New(testbed.Config{IPv4: true, IPv6: true, PodCIDRv4: netip.MustParsePrefix(v4), PodCIDRv6: netip.MustParsePrefix(v6),
		TCPPorts: []uint16{80}, UDPPorts: []uint16{80}, SCTPPorts: []uint16{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.Close() })
	node := bed.LocalNode()
	nodeName := "node-" + string(mode)
	ns := "kp-" + string(mode)
	if _, err := kubetest.CreateNode(ctx, client, nodeName, []netip.Prefix{node.PodCIDRv4, node.PodCIDRv6}, node.NodeIPs()); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.EnsureNamespace(ctx, client, ns, nil); err != nil {
		t.Fatal(err)
	}
	server, err := bed.AddPod(ns, "server")
	if err != nil {
		t.Fatal(err)
	}
	client1, err := bed.AddPod(ns, "client")
	if err != nil {
		t.Fatal(err)
	}
	dual := corev1.IPFamilyPolicyRequireDualStack
	svc, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeNodePort,
			IPFamilyPolicy: &dual,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 8080, TargetPort: intstr.FromInt32(80)},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var eps []kubetest.SliceEndpoint
	for _, ip := range server.IPs() {
		eps = append(eps, kubetest.SliceEndpoint{IP: ip, NodeName: nodeName, PodName: "server"})
	}
	if err := kubetest.ApplyEndpointSlices(ctx, client, kubetest.EndpointSlices(svc, eps...)...); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	p := kubeproxy.Start(t, kubeproxy.Options{Node: node, NodeName: nodeName, Server: srv, Mode: mode,
		ClusterCIDRs: []netip.Prefix{node.PodCIDRv4, node.PodCIDRv6}})
	if err := p.WaitProgrammed(time.Minute, client); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitSynced(30*time.Second, began); err != nil {
		t.Fatal(err)
	}
	if err := p.Healthz(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: programmed %v after start", mode, time.Since(began).Round(time.Millisecond))

	probeAll := func(step string) {
		t.Helper()
		var probes []testbed.Probe
		for _, ip := range svc.Spec.ClusterIPs {
			for _, proto := range []testbed.Protocol{testbed.TCP, testbed.UDP} {
				probes = append(probes, testbed.Probe{Src: client1, Dst: netip.MustParseAddr(ip), Port: 8080, Protocol: proto, Timeout: 3 * time.Second})
			}
		}
		for _, err := range bed.ProbeAllResults(ctx, probes) {
			if err != nil {
				t.Fatalf("%s: a pod cannot reach the Service: %v", step, err)
			}
		}
		// NodePort, from the node itself to its own address.
		np := uint16(svc.Spec.Ports[0].NodePort)
		if _, err := node.ProbeResult(ctx, testbed.Probe{Dst: node.NodeIP(4), Port: np, Protocol: testbed.TCP, Timeout: 3 * time.Second}); err != nil {
			t.Fatalf("%s: NodePort %d: %v", step, np, err)
		}
	}
	probeAll("started")

	// An endpoint goes away: WaitProgrammed sees the rules follow.
	if err := kubetest.ApplyEndpointSlices(ctx, client, kubetest.EndpointSlices(svc, kubetest.SliceEndpoint{IP: server.IPv4, NodeName: nodeName, PodName: "server"},
		kubetest.SliceEndpoint{IP: server.IPv6, NodeName: nodeName, PodName: "server", NotReady: true})...); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitProgrammed(30*time.Second, client); err != nil {
		t.Fatal(err)
	}
	want, err := kubeproxy.Expected(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range want {
		if sp.Service == ns+"/web" && sp.Addr.Is6() && len(sp.Endpoints) != 0 {
			t.Fatalf("Expected lists a not-ready endpoint: %s", sp)
		}
	}
	if err := kubetest.ApplyEndpointSlices(ctx, client, kubetest.EndpointSlices(svc, eps...)...); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitProgrammed(30*time.Second, client); err != nil {
		t.Fatal(err)
	}

	restarted := time.Now()
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitSynced(time.Minute, restarted); err != nil {
		t.Fatal(err)
	}
	probeAll("restarted")
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if p.Running() {
		t.Fatal("running after Kill")
	}
	// The rules stay when kube-proxy is gone.
	probeAll("killed")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitSynced(time.Minute, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(p.Logs(), "----- kubeproxy: start #"); n != 2 {
		t.Errorf("log holds %d restarts, want 2", n)
	}
}
