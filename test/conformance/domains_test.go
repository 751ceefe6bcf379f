package conformance

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/testkit/minicluster"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// The world outside the cluster that the domain names resolve to: a documentation range,
// local in the underlay namespace, answering on port 8080.
var (
	outsideRange = netip.MustParsePrefix("198.51.100.0/24")
	outsidePort  = 8080
)

// domainLookups is how many names the client resolves and connects to, each a new address.
const domainLookups = 240

// checkDomainNames proves domainNames egress on a real cluster: the client on node-1 asks the
// kube-dns Service's ClusterIP (kube-proxy's DNAT to a "CoreDNS" pod on node-2, whose DNS
// server the test runs in that pod's namespace), and connects to each answer outside the
// cluster at once. The agents learn the DNS pods from the API server.
func checkDomainNames(t *testing.T, ctx context.Context, c *minicluster.Cluster) {
	lnDone := startOutsideEcho(t, c)
	defer lnDone()

	// The DNS pod and its Service, as a cluster deploys CoreDNS.
	dnsPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": "node-2"},
			Containers:   []corev1.Container{{Name: "pause", Image: agnhostImage, Args: []string{"pause"}}},
		},
	}
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Labels: map[string]string{"name": "client"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": "node-1"},
			Containers:   []corev1.Container{{Name: "pause", Image: agnhostImage, Args: []string{"pause"}}},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"k8s-app": "kube-dns"},
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt(53)},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(53)},
			},
		},
	}
	ns := "domains"
	mustCreate(t, func() error {
		_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Client.CoreV1().Pods("kube-system").Create(ctx, dnsPod, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Client.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Client.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error { return createDomainPolicies(ctx, c, ns) })
	waitPodsReady(t, ctx, c, "kube-system", 1)
	waitPodsReady(t, ctx, c, ns, 1)
	got, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop := startPodDNS(t, got)
	defer stop()
	if got, err = c.Client.CoreV1().Pods(ns).Get(ctx, "client", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	clientNS, err := netns.GetFromPath(minicluster.PodNetNS(got))
	if err != nil {
		t.Fatal(err)
	}
	defer clientNS.Close()
	svcGot, err := c.Client.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	server := net.JoinHostPort(svcGot.Spec.ClusterIP, "53")

	// Until the policies are in both nodes' kernels, an answer may not be learned: wait for
	// the first name to work (and an address no answer gave to be denied).
	dial := func(addr netip.Addr, timeout time.Duration) error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, uint16(outsidePort)).String(), timeout)
		if err != nil {
			return err
		}
		return c.Close()
	}
	resolve := func(name string) (netip.Addr, error) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, server)
		if err != nil {
			return netip.Addr{}, err
		}
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ip, _ := netip.AddrFromSlice(a.A.To4())
				return ip, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("%s: no address in %v", name, r.Answer)
	}
	began := time.Now()
	var failures []string
	err = testbed.InNetNSGo(clientNS, func() error {
		never := nthAddr(outsideRange, 254)
		if err := waitVerdict(ctx, func(string) error { return dial(never, 500*time.Millisecond) }, never.String(), false); err != nil {
			return fmt.Errorf("an address no answer gave: %w", err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			addr, err := resolve("n0.example.test")
			if err == nil {
				if err = dial(addr, 900*time.Millisecond); err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the first name never connected: %w", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		for i := 1; i <= domainLookups; i++ {
			name := fmt.Sprintf("n%d.example.test", i)
			addr, err := resolve(name)
			if err == nil {
				// Before the first SYN is retransmitted: a first packet dropped fails.
				err = dial(addr, 900*time.Millisecond)
			}
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s: %v", name, err))
			}
		}
		if err := dial(nthAddr(outsideRange, 253), 500*time.Millisecond); err == nil {
			return fmt.Errorf("%s, which no answer gave, was reached", nthAddr(outsideRange, 253))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d lookups through the kube-dns ClusterIP (DNS pod on the other node), each then connected: %d failed, in %v",
		domainLookups, len(failures), time.Since(began).Round(time.Millisecond))
	if len(failures) > 0 {
		t.Errorf("%d of %d failed, first: %v", len(failures), domainLookups, failures[:min(5, len(failures))])
	}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func nthAddr(p netip.Prefix, i int) netip.Addr {
	a := p.Addr()
	for range i {
		a = a.Next()
	}
	return a
}

// startOutsideEcho makes the whole outside range answer on outsidePort in the underlay.
func startOutsideEcho(t *testing.T, c *minicluster.Cluster) func() {
	t.Helper()
	var ln net.Listener
	err := c.InUnderlay(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		local := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: ipNet(outsideRange), Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST}
		if err := netlink.RouteAdd(local); err != nil {
			return fmt.Errorf("local route %s: %w", outsideRange, err)
		}
		// The pods' traffic to documentation ranges is not masqueraded (deploy/'s config):
		// the replies go back to each node's pod CIDR.
		for _, n := range c.Nodes {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(n.PodCIDR), Gw: n.IP.AsSlice()}); err != nil {
				return fmt.Errorf("route to %s via %s: %w", n.PodCIDR, n.IP, err)
			}
		}
		ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", outsidePort))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.Copy(io.Discard, conn)
			}()
		}
	}()
	return func() { ln.Close() }
}

// startPodDNS runs a DNS server in the pod's namespace on its address: every nN.example.test
// is 198.51.100.N+1 (N below 250).
func startPodDNS(t *testing.T, pod *corev1.Pod) func() {
	t.Helper()
	h, err := netns.GetFromPath(minicluster.PodNetNS(pod))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		var n int
		if _, err := fmt.Sscanf(strings.ToLower(q.Name), "n%d.example.test.", &n); err == nil && n < 250 && q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN A %s", q.Name, nthAddr(outsideRange, n+1)))
			m.Answer = append(m.Answer, rr)
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	var servers []*dns.Server
	err = testbed.InNetNSGo(h, func() error {
		addr := net.JoinHostPort(pod.Status.PodIP, "53")
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			pc.Close()
			return err
		}
		servers = append(servers, &dns.Server{PacketConn: pc, Handler: handler}, &dns.Server{Listener: ln, Handler: handler})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		go func() { _ = s.ActivateAndServe() }()
	}
	return func() {
		for _, s := range servers {
			_ = s.Shutdown()
		}
	}
}

// createDomainPolicies: the namespace's pods may reach the cluster DNS and *.example.test on
// port 8080 (Admin tier), nothing else (Baseline tier).
func createDomainPolicies(ctx context.Context, c *minicluster.Cluster, ns string) error {
	npa, err := npaclient.NewForConfig(c.Server.AdminConfig())
	if err != nil {
		return err
	}
	subject := npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
	port := func(n int32) *npav1beta1.Port { return &npav1beta1.Port{Number: n} }
	for _, cnp := range []*npav1beta1.ClusterNetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "domains-allow"}, Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier: npav1beta1.AdminTier, Priority: 20, Subject: subject,
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
					To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Pods: &npav1beta1.NamespacedPod{
						NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
						PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}}}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{
						{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: port(53)}},
						{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: port(53)}}}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
					To:        []npav1beta1.ClusterNetworkPolicyEgressPeer{{DomainNames: []npav1beta1.DomainName{"*.example.test"}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: port(int32(outsidePort))}}}},
			}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "domains-deny"}, Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier: npav1beta1.BaselineTier, Priority: 20, Subject: subject,
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"0.0.0.0/0"}}}}}}},
	} {
		if _, err := npa.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, cnp, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}
