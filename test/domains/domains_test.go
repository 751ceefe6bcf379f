// Package domains_test proves ClusterNetworkPolicy domainNames peers with packets: a node
// whose "kube-dns" pod runs a real DNS server (github.com/miekg/dns), a client pod that
// resolves names through it and connects to the answers, a pod that forges answers, and an
// "Internet" namespace whose whole documentation ranges answer on port 8080.
package domains_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// The Internet's answering ranges (documentation prefixes, inside the test's namespaces only).
var (
	rangeV4     = netip.MustParsePrefix("198.51.100.0/24")
	manyV4      = netip.MustParsePrefix("203.0.113.0/24")
	rangeV6     = netip.MustParsePrefix("2001:db8:cccc::/64")
	manyV6      = netip.MustParsePrefix("2001:db8:dddd::/64")
	forgedAddr  = netip.MustParseAddr("198.51.100.250")
	neverAddr4  = netip.MustParseAddr("198.51.100.251")
	neverAddr6  = netip.MustParseAddr("2001:db8:cccc::ffff:ffff")
	serverPort  = uint16(8080)
	manyAnswers = 150
)

// iterations of resolve-then-connect: 10,000, or $NETWARDEN_DOMAINS_ITERATIONS.
var iterations = func() int {
	if n, err := strconv.Atoi(os.Getenv("NETWARDEN_DOMAINS_ITERATIONS")); err == nil && n > 0 {
		return n
	}
	return 10000
}()

// zone is the DNS server's data: name → records, answered as a real server does (CNAME chains
// chased within the zone, TTLs as written).
type zone struct {
	mu      sync.Mutex
	records map[string][]dns.RR
}

func (z *zone) add(rr string) {
	r, err := dns.NewRR(rr)
	if err != nil {
		panic(err)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	name := strings.ToLower(r.Header().Name)
	z.records[name] = append(z.records[name], r)
}

func (z *zone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) == 1 {
		q := req.Question[0]
		z.mu.Lock()
		name := strings.ToLower(q.Name)
		for hops := 0; hops < 8; hops++ {
			var next string
			for _, rr := range z.records[name] {
				switch r := rr.(type) {
				case *dns.CNAME:
					next = strings.ToLower(r.Target)
					m.Answer = append(m.Answer, dns.Copy(rr))
				case *dns.A:
					if q.Qtype == dns.TypeA {
						m.Answer = append(m.Answer, dns.Copy(rr))
					}
				case *dns.AAAA:
					if q.Qtype == dns.TypeAAAA {
						m.Answer = append(m.Answer, dns.Copy(rr))
					}
				}
			}
			if next == "" {
				break
			}
			name = next
		}
		z.mu.Unlock()
		if len(m.Answer) > 0 && strings.EqualFold(m.Answer[0].Header().Name, q.Name) {
			m.Answer[0].Header().Name = q.Name // the owner name as asked, as servers echo it
		}
		if len(m.Answer) == 0 {
			m.Rcode = dns.RcodeNameError
		}
	}
	_ = w.WriteMsg(m)
}

type backend struct {
	name, flag, iptablesMode string
}

var backends = []backend{
	{"nftables", "nftables", ""},
	{"iptables-nft", "iptables", "nft"},
	{"iptables-legacy", "iptables", "legacy"},
}

// scene is the node: the agent, the pods, the DNS server and the Internet.
type scene struct {
	t       testing.TB
	be      backend
	sim     *simnode.Sim
	client  *testbed.Pod
	forger  *testbed.Pod
	dnsPod  *testbed.Pod
	inet    *testbed.Internet
	zone    *zone
	servers []*dns.Server
	objs    []runtime.Object // every object but the policies
	flags   []string         // the agent's
}

// setPolicies writes the state with these ClusterNetworkPolicies.
func (s *scene) setPolicies(cnps []*npav1beta1.ClusterNetworkPolicy) {
	s.t.Helper()
	objs := slices.Clone(s.objs)
	for _, c := range cnps {
		objs = append(objs, c)
	}
	if err := s.sim.SetState(objs...); err != nil {
		s.t.Fatal(err)
	}
}

func newScene(t testing.TB, be backend) *scene {
	t.Helper()
	kerneltest.RequireAgent(t, simnode.AgentBinary)
	if be.iptablesMode != "" {
		t.Setenv("NETWARDEN_IPTABLES_MODE", be.iptablesMode)
	}
	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{IPv4: true, IPv6: true}})
	if err != nil {
		t.Fatal(err)
	}
	s := &scene{t: t, be: be, sim: sim, zone: &zone{records: map[string][]dns.RR{}}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", lastLines(sim.Log(), 60))
			out, _ := exec.Command("ip", "netns", "exec", sim.Bed.NodeNetNSName(), "sh", "-c",
				"nft list ruleset; iptables-"+be.iptablesMode+"-save -t mangle; ipset list -t").CombinedOutput()
			t.Logf("kernel:\n%s", lastLines(string(out), 150))
		}
		for _, srv := range s.servers {
			_ = srv.Shutdown()
		}
		if s.inet != nil {
			s.inet.Close()
		}
		if err := sim.Close(); err != nil {
			t.Errorf("closing test bed: %v", err)
		}
	})
	if s.inet, err = sim.Bed.AddInternet(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []netip.Prefix{rangeV4, manyV4, rangeV6, manyV6} {
		if err := s.inet.AddLocalRange(p); err != nil {
			t.Fatal(err)
		}
	}
	s.startEchoServers()

	clientObj, client, err := sim.AddPod("default", "client", map[string]string{"app": "client"})
	if err != nil {
		t.Fatal(err)
	}
	// The forger is in a namespace no policy judges, so its packets reach the client.
	forgerObj, forger, err := sim.AddPod("elsewhere", "forger", map[string]string{"app": "forger"})
	if err != nil {
		t.Fatal(err)
	}
	dnsObj, dnsPod, err := sim.AddPod("kube-system", "coredns", map[string]string{"k8s-app": "kube-dns"},
		corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
		corev1.ContainerPort{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP})
	if err != nil {
		t.Fatal(err)
	}
	s.client, s.forger, s.dnsPod = client, forger, dnsPod
	s.startDNS()

	s.objs = []runtime.Object{
		simnode.Namespace("default", map[string]string{"kubernetes.io/metadata.name": "default"}),
		simnode.Namespace("kube-system", map[string]string{"kubernetes.io/metadata.name": "kube-system"}),
		simnode.Namespace("elsewhere", map[string]string{"kubernetes.io/metadata.name": "elsewhere"}),
		clientObj, forgerObj, dnsObj,
	}
	s.setPolicies(policies(sim.Bed.NodeIP(4)))
	// A resync every second: the drift checks must take the learned addresses as they are.
	flags := []string{"--backend", be.flag, "--dns-grace=1s", "--resync-period=1s"}
	if be.flag == "nftables" {
		flags = append(flags, "--policy-counters") // counts the Baseline deny's drops
	}
	s.flags = flags
	if err := sim.StartAgent(flags...); err != nil {
		t.Fatal(err)
	}
	if err := sim.WaitApplied(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// policies: DNS to kube-dns and the two domain patterns admitted in the Admin tier, every
// other egress of the default namespace denied in the Baseline tier.
func policies(nodeIP netip.Addr) []*npav1beta1.ClusterNetworkPolicy {
	subject := npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "default"}}}
	port53 := func(p corev1.Protocol) npav1beta1.ClusterNetworkPolicyProtocol {
		pp := &npav1beta1.Port{Number: 53}
		if p == corev1.ProtocolUDP {
			return npav1beta1.ClusterNetworkPolicyProtocol{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: pp}}
		}
		return npav1beta1.ClusterNetworkPolicyProtocol{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: pp}}
	}
	cnp := func(name string, tier npav1beta1.Tier, prio int32, rules ...npav1beta1.ClusterNetworkPolicyEgressRule) *npav1beta1.ClusterNetworkPolicy {
		return &npav1beta1.ClusterNetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       npav1beta1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject, Egress: rules},
		}
	}
	return []*npav1beta1.ClusterNetworkPolicy{
		cnp("cluster-dns", npav1beta1.AdminTier, 5, npav1beta1.ClusterNetworkPolicyEgressRule{
			Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
			To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Pods: &npav1beta1.NamespacedPod{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
				PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
			}}, {Networks: []npav1beta1.CIDR{npav1beta1.CIDR(netip.PrefixFrom(nodeIP, 32).String())}}}, // a node-local DNS
			Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{port53(corev1.ProtocolUDP), port53(corev1.ProtocolTCP)},
		}),
		cnp("allowed-domains", npav1beta1.AdminTier, 10, npav1beta1.ClusterNetworkPolicyEgressRule{
			Name:   "by-name",
			Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
			To:     []npav1beta1.ClusterNetworkPolicyEgressPeer{{DomainNames: []npav1beta1.DomainName{"*.example.test", "api.other.test"}}},
			Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1beta1.Port{Number: int32(serverPort)}}}},
		}),
		// The Baseline tier admits a name of its own, ahead of its deny.
		cnp("baseline-domains", npav1beta1.BaselineTier, 5, npav1beta1.ClusterNetworkPolicyEgressRule{
			Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
			To:     []npav1beta1.ClusterNetworkPolicyEgressPeer{{DomainNames: []npav1beta1.DomainName{"baseline.test."}}},
		}),
		cnp("deny-egress", npav1beta1.BaselineTier, 10, npav1beta1.ClusterNetworkPolicyEgressRule{
			Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
			To:     []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"0.0.0.0/0", "::/0"}}},
		}),
	}
}

// startEchoServers answers on every Internet address at serverPort: each line comes back.
func (s *scene) startEchoServers() {
	var lns []net.Listener
	err := s.inet.InNetNSGo(func() error {
		for _, network := range []string{"tcp4", "tcp6"} {
			addr := "0.0.0.0"
			if network == "tcp6" {
				addr = "[::]"
			}
			ln, err := net.Listen(network, addr+":"+strconv.Itoa(int(serverPort)))
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, ln := range lns {
		s.t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					_, _ = io.Copy(c, c)
				}()
			}
		}()
	}
}

// startDNS runs the DNS server in the kube-dns pod on both of its addresses, UDP and TCP.
func (s *scene) startDNS() {
	z := s.zone
	z.add("a.example.test. 60 IN A 198.51.100.10")
	z.add("x.y.example.test. 60 IN A 198.51.100.11")
	z.add("example.test. 60 IN A 198.51.100.12")
	z.add("api.other.test. 60 IN CNAME lb.cdn.test.")
	z.add("lb.cdn.test. 60 IN A 198.51.100.13")
	z.add("www.other.test. 60 IN CNAME api2.other.test.")
	z.add("api2.other.test. 60 IN CNAME api.other.test.")
	z.add("xapi.other.test. 60 IN A 198.51.100.15")
	z.add("upper.example.test. 60 IN A 198.51.100.16")
	z.add("v6.example.test. 60 IN AAAA 2001:db8:cccc::16")
	z.add("short.example.test. 1 IN A 198.51.100.20")
	z.add("tcp.example.test. 60 IN A 198.51.100.21")
	z.add("evil.test. 60 IN A 198.51.100.22")
	z.add("after-repair.example.test. 60 IN A 198.51.100.23")
	z.add("node.example.test. 60 IN A 198.51.100.24")
	z.add("baseline.test. 60 IN A 198.51.100.25")
	for i := 1; i <= manyAnswers; i++ {
		z.add(fmt.Sprintf("many.example.test. 60 IN A %s", nth(manyV4, i)))
		z.add(fmt.Sprintf("many6.example.test. 60 IN AAAA %s", nth(manyV6, i)))
	}
	for i := 1; i <= iterations; i++ {
		z.add(fmt.Sprintf("n%d.example.test. 300 IN AAAA %s", i, nth(rangeV6, i)))
	}
	var ready sync.WaitGroup
	err := s.dnsPod.InNetNSGo(func() error {
		for _, ip := range s.dnsPod.IPs() {
			addr := net.JoinHostPort(ip.String(), "53")
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			for _, srv := range []*dns.Server{{PacketConn: pc, Handler: z}, {Listener: ln, Handler: z}} {
				ready.Add(1)
				srv.NotifyStartedFunc = ready.Done
				s.servers = append(s.servers, srv)
			}
		}
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, srv := range s.servers {
		go func() { _ = srv.ActivateAndServe() }()
	}
	ready.Wait()
}

func nth(p netip.Prefix, i int) netip.Addr {
	a := p.Addr()
	for range i {
		a = a.Next()
	}
	return a
}

// startNodeDNS runs the DNS server in the node's namespace on addr, UDP only.
func (s *scene) startNodeDNS(addr netip.Addr) (*dns.Server, error) {
	var srv *dns.Server
	err := s.sim.Bed.InNode(func() error {
		pc, err := net.ListenPacket("udp", net.JoinHostPort(addr.String(), "53"))
		if err != nil {
			return err
		}
		srv = &dns.Server{PacketConn: pc, Handler: s.zone}
		return nil
	})
	if err != nil {
		return nil, err
	}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	return srv, nil
}

// resolver asks the kube-dns pod from the client pod.
type resolver struct {
	s   *scene
	udp *dns.Client
	tcp *dns.Client
}

func (s *scene) resolver() *resolver {
	return &resolver{s: s, udp: &dns.Client{Net: "udp", Timeout: 2 * time.Second, UDPSize: 65535}, tcp: &dns.Client{Net: "tcp", Timeout: 2 * time.Second}}
}

// lookup asks for name (type A or AAAA) over network ("udp" or "tcp") from the client pod,
// and returns the addresses of the answer. It runs on a thread in the client's namespace.
func (r *resolver) lookup(name string, qtype uint16, network string, edns bool) ([]netip.Addr, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if edns {
		m.SetEdns0(65535, false)
	}
	c := r.udp
	if network == "tcp" {
		c = r.tcp
	}
	server := net.JoinHostPort(r.s.dnsPod.IPv4.String(), "53")
	if qtype == dns.TypeAAAA {
		server = net.JoinHostPort(r.s.dnsPod.IPv6.String(), "53")
	}
	return r.exchange(c, m, server)
}

// lookupAt asks server (host:port) over UDP.
func (r *resolver) lookupAt(server, name string, qtype uint16) ([]netip.Addr, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return r.exchange(r.udp, m, server)
}

func (r *resolver) exchange(c *dns.Client, m *dns.Msg, server string) ([]netip.Addr, error) {
	resp, _, err := c.Exchange(m, server)
	if err != nil {
		return nil, err
	}
	if resp.Truncated {
		return nil, fmt.Errorf("%s: answer truncated", m.Question[0].Name)
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		switch a := rr.(type) {
		case *dns.A:
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		case *dns.AAAA:
			ip, _ := netip.AddrFromSlice(a.AAAA)
			out = append(out, ip)
		}
	}
	return out, nil
}

// connect opens a TCP connection from the client pod's thread (the caller is in its netns)
// and checks one echo. A packet the rules drop makes it time out.
func connect(addr netip.Addr, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, serverPort).String(), timeout)
	if err != nil {
		return nil, err
	}
	if err := echo(c, timeout); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func echo(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echo %q", line)
	}
	return nil
}

// inClient runs fn on a thread in the client pod's namespace.
func (s *scene) inClient(fn func() error) error { return s.client.InNetNSGo(fn) }

// reachable resolves name as asked and connects to every address of the answer.
func (s *scene) reachable(name string, qtype uint16, network string, edns bool) (addrs []netip.Addr, failed []string, err error) {
	r := s.resolver()
	err = s.inClient(func() error {
		var err error
		if addrs, err = r.lookup(name, qtype, network, edns); err != nil {
			return err
		}
		for _, a := range addrs {
			c, err := connect(a, 2*time.Second)
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", a, err))
				continue
			}
			c.Close()
		}
		return nil
	})
	return addrs, failed, err
}

func TestDomainNames(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) { testDomainNames(t, be) })
	}
}

func testDomainNames(t *testing.T, be backend) {
	s := newScene(t, be)

	// An address no answer gave is denied (not a subtest: what follows counts from it).
	{
		err := s.inClient(func() error {
			for _, a := range []netip.Addr{neverAddr4, neverAddr6} {
				if c, err := connect(a, 500*time.Millisecond); err == nil {
					c.Close()
					return fmt.Errorf("%s answered: the Baseline tier should deny it", a)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	deniedByBaseline := s.baselineDrops()
	if deniedByBaseline == 0 {
		t.Fatalf("the Baseline deny counted no drop for the two denied connections")
	}
	if deniedByBaseline < 0 {
		deniedByBaseline = 0 // no per-policy counters on this backend: the connections count
	}

	t.Run("resolve then connect", func(t *testing.T) {
		// Every name has an address of its own, never answered before: each connection is
		// the first to its address, made as soon as the answer is read.
		r := s.resolver()
		var failures []string
		began := time.Now()
		err := s.inClient(func() error {
			for i := 1; i <= iterations; i++ {
				name := fmt.Sprintf("n%d.example.test", i)
				addrs, err := r.lookup(name, dns.TypeAAAA, "udp", false)
				if err != nil || len(addrs) != 1 {
					failures = append(failures, fmt.Sprintf("%s: lookup %v %v", name, addrs, err))
					continue
				}
				timeout := 3 * time.Second
				if s.be.flag != "nftables" {
					timeout = 900 * time.Millisecond // before the first SYN retransmission
				}
				c, err := connect(addrs[0], timeout)
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s (%s): %v", name, addrs[0], err))
					continue
				}
				c.Close()
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		drops, counted := 0.0, "not counted on this backend"
		if n := s.baselineDrops(); n >= 0 {
			drops = n - deniedByBaseline
			counted = strconv.FormatFloat(drops, 'f', -1, 64)
		}
		t.Logf("%s: %d resolve-then-connect in %v (%v each); connections failed: %d; packets the Baseline deny dropped meanwhile: %s",
			s.be.name, iterations, took.Round(time.Millisecond), (took / time.Duration(iterations)).Round(time.Microsecond), len(failures), counted)
		if len(failures) > 0 {
			t.Errorf("%d of %d failed, first: %v", len(failures), iterations, failures[:min(5, len(failures))])
		}
		if drops != 0 {
			t.Errorf("the Baseline deny dropped %v packets: some first packet came before its address", drops)
		}
	})

	t.Run("names", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			qtype   uint16
			network string
			allowed bool
		}{
			{"a.example.test", dns.TypeA, "udp", true},
			{"x.y.example.test", dns.TypeA, "udp", true},   // the wildcard takes several labels
			{"example.test", dns.TypeA, "udp", false},      // but not the bare domain
			{"api.other.test", dns.TypeA, "udp", true},     // exact name, answered through a CNAME
			{"www.other.test", dns.TypeA, "udp", true},     // a chain through the exact name
			{"xapi.other.test", dns.TypeA, "udp", false},   // an exact name is no suffix
			{"UPPER.Example.TEST", dns.TypeA, "udp", true}, // names compare without case
			{"v6.example.test", dns.TypeAAAA, "udp", true}, // AAAA
			{"tcp.example.test", dns.TypeA, "tcp", true},   // DNS over TCP
			{"evil.test", dns.TypeA, "udp", false},         // no pattern matches
			{"baseline.test", dns.TypeA, "udp", true},      // a Baseline tier pattern, written with its dot
		} {
			addrs, failed, err := s.reachable(c.name, c.qtype, c.network, false)
			if err != nil || len(addrs) == 0 {
				t.Errorf("%s: lookup: %v %v", c.name, addrs, err)
				continue
			}
			if c.allowed && len(failed) > 0 {
				t.Errorf("%s: should connect: %v", c.name, failed)
			}
			if !c.allowed && len(failed) != len(addrs) {
				t.Errorf("%s: should be denied, but %d of %v connected", c.name, len(addrs)-len(failed), addrs)
			}
		}
	})

	t.Run("many addresses", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			qtype   uint16
			network string
			edns    bool
		}{
			{"many.example.test", dns.TypeA, "tcp", false},
			{"many6.example.test", dns.TypeAAAA, "udp", true}, // a large UDP answer (EDNS0), in IP fragments
		} {
			addrs, failed, err := s.reachable(c.name, c.qtype, c.network, c.edns)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if len(addrs) != manyAnswers || len(failed) > 0 {
				t.Errorf("%s over %s: %d addresses, %d failed: %v", c.name, c.network, len(addrs), len(failed), failed[:min(3, len(failed))])
			}
		}
	})

	t.Run("a forged answer opens nothing", func(t *testing.T) {
		// The forger answers from port 53 of its own address, to a socket of the client's
		// that waits for it: the pod reads the answer, the node believes none of it.
		forged := new(dns.Msg)
		forged.SetQuestion("forged.example.test.", dns.TypeA)
		forged.Response = true
		rr, _ := dns.NewRR("forged.example.test. 300 IN A " + forgedAddr.String())
		forged.Answer = []dns.RR{rr}
		wire, err := forged.Pack()
		if err != nil {
			t.Fatal(err)
		}
		refusedBefore := s.metric(`netwarden_domain_answers_total{outcome="refused"}`)
		var pc net.PacketConn
		if err := s.inClient(func() error {
			var err error
			pc, err = net.ListenPacket("udp4", net.JoinHostPort(s.client.IPv4.String(), "5300"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		err = s.forger.InNetNSGo(func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.forger.IPv4, 53)),
				net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.client.IPv4, 5300)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write(wire)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 1500)
		if _, _, err := pc.ReadFrom(buf); err != nil {
			t.Fatalf("the forged answer did not reach the client: %v", err)
		}
		if err := s.inClient(func() error {
			if c, err := connect(forgedAddr, 500*time.Millisecond); err == nil {
				c.Close()
				return fmt.Errorf("%s answered after a forged answer", forgedAddr)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if got := s.metric(`netwarden_domain_answers_total{outcome="refused"}`); got <= refusedBefore {
			t.Errorf("refused answers: %v before, %v after a forged one", refusedBefore, got)
		}
	})

	t.Run("expiry", func(t *testing.T) {
		// short.example.test has a TTL of 1 s; the agent's grace is 1 s.
		addr := netip.MustParseAddr("198.51.100.20")
		r := s.resolver()
		var held net.Conn
		err := s.inClient(func() error {
			if _, err := r.lookup("short.example.test", dns.TypeA, "udp", false); err != nil {
				return err
			}
			var err error
			held, err = connect(addr, 2*time.Second)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		set := s.setHolding("allowed-domains", addr)
		if set == "" {
			t.Fatalf("no domain set holds %s", addr)
		}
		deadline := time.Now().Add(15 * time.Second)
		for s.setHas(set, addr) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still in %s after 15 s (TTL 1 s, grace 1 s)", addr, set)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := s.inClient(func() error {
			if c, err := connect(addr, 500*time.Millisecond); err == nil {
				c.Close()
				return fmt.Errorf("a new connection to %s passed after it expired", addr)
			}
			return echo(held, 2*time.Second)
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("a repair keeps what was learned", func(t *testing.T) {
		// An admin flushes the ruleset: the agent replaces its tables, the learned addresses
		// with them, and the queue rules. a.example.test (TTL 60 s) was answered above.
		st, err := s.sim.Status()
		if err != nil || st.NetworkPolicy == nil {
			t.Fatalf("status: %+v %v", st, err)
		}
		repairs := st.NetworkPolicy.Repairs
		if _, err := s.sim.Nft("flush", "ruleset"); err != nil {
			t.Fatal(err)
		}
		if err := s.sim.WaitStatus(30*time.Second, "a repair after nft flush ruleset", func(st statusapi.Status) bool {
			return st.NetworkPolicy != nil && st.NetworkPolicy.Repairs > repairs
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.inClient(func() error {
			c, err := connect(netip.MustParseAddr("198.51.100.10"), 2*time.Second)
			if err != nil {
				return fmt.Errorf("a learned address after the repair: %w", err)
			}
			return c.Close()
		}); err != nil {
			t.Error(err)
		}
		if out, _ := s.sim.Nft("list", "table", "ip", "netwarden-dns"); !strings.Contains(out, "queue") {
			t.Errorf("the queue rules were not repaired:\n%s", out)
		}
		if _, failed, err := s.reachable("after-repair.example.test", dns.TypeA, "udp", false); err != nil || len(failed) > 0 {
			t.Errorf("a new name after the repair: %v %v", failed, err)
		}
	})

	t.Run("explain", func(t *testing.T) {
		explain := func(to string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, _ := s.sim.RunAgent(ctx, "explain", "--manifests", s.sim.Dir, "--node-name", s.sim.NodeName, "--kernel",
				"--from", "default/client", "--to", to, "--port", "8080/tcp")
			return out
		}
		// a.example.test was answered (TTL 60 s) and connected to above.
		out := explain("198.51.100.10")
		t.Logf("netwarden explain --kernel --from default/client --to 198.51.100.10 --port 8080/tcp:\n%s", out)
		for _, want := range []string{"allowed by ClusterNetworkPolicy allowed-domains", "198.51.100.10 is an address of *.example.test",
			`learned from the answer "a.example.test via a.example.test from ` + s.dnsPod.IPv4.String(), "verdict: allowed"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain of a learned address lacks %q:\n%s", want, out)
			}
		}
		out = explain(neverAddr4.String())
		for _, want := range []string{"198.51.100.251 is no address of *.example.test learned on this node", "denied by ClusterNetworkPolicy deny-egress", "verdict: denied"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain of an address never answered lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		for _, m := range []string{"netwarden_domain_names", "netwarden_domain_addresses",
			`netwarden_domain_answers_total{outcome="believed"}`, `netwarden_domain_answers_total{outcome="admitting"}`} {
			if v := s.metric(m); v <= 0 {
				t.Errorf("%s = %v", m, v)
			}
		}
	})

	t.Run("no drift", func(t *testing.T) {
		// The one repair is the flush's: the learner's writes are never taken for drift.
		if n := strings.Count(s.sim.Log(), "repairing kernel state"); n != 1 {
			t.Errorf("%d repairs logged, want 1 (the flush's):\n%s", n, lastLines(s.sim.Log(), 40))
		}
	})

	t.Run("a node-local DNS server", func(t *testing.T) {
		// A DNS server on the node's own address answers through the output hook. Not a
		// kube-dns pod, it is not believed until --dns-servers names it.
		nodeIP := s.sim.Bed.NodeIP(4)
		pc, err := s.startNodeDNS(nodeIP)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Shutdown()
		r := s.resolver()
		lookupAndConnect := func() error {
			return s.inClient(func() error {
				addrs, err := r.lookupAt(net.JoinHostPort(nodeIP.String(), "53"), "node.example.test", dns.TypeA)
				if err != nil || len(addrs) != 1 {
					return fmt.Errorf("lookup at the node: %v %v", addrs, err)
				}
				c, err := connect(addrs[0], 900*time.Millisecond)
				if err != nil {
					return err
				}
				return c.Close()
			})
		}
		if err := lookupAndConnect(); err == nil {
			t.Errorf("an answer of the node's DNS server, which is no kube-dns pod, admitted its address")
		}
		if err := s.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		flags := append(slices.Clone(s.flags), "--dns-servers="+strings.Join([]string{s.dnsPod.IPv4.String(), s.dnsPod.IPv6.String(), nodeIP.String()}, ","))
		if err := s.sim.StartAgent(flags...); err != nil {
			t.Fatal(err)
		}
		if err := s.sim.WaitApplied(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := lookupAndConnect(); err != nil {
			t.Errorf("an answer of a DNS server --dns-servers names: %v", err)
		}
	})

	t.Run("a restart keeps what was learned", func(t *testing.T) {
		// The restarted agent's first sync replaces its rules; a.example.test (TTL 60 s),
		// answered before, stays admitted without a new lookup.
		if err := s.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		if err := s.sim.StartAgent(s.flags...); err != nil {
			t.Fatal(err)
		}
		if err := s.sim.WaitApplied(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := s.inClient(func() error {
			c, err := connect(netip.MustParseAddr("198.51.100.10"), 2*time.Second)
			if err != nil {
				return fmt.Errorf("a learned address after a restart: %w", err)
			}
			return c.Close()
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("DNS works while the agent is down", func(t *testing.T) {
		if err := s.sim.StopAgent(); err != nil {
			t.Fatal(err)
		}
		addrs, _, err := s.reachable("a.example.test", dns.TypeA, "udp", false)
		if err != nil || len(addrs) != 1 {
			t.Fatalf("lookup with the agent stopped: %v %v", addrs, err)
		}
	})
}

// baselineDrops is the packets the Baseline deny dropped, from the agent's counters; -1 where
// the backend has no per-policy counters (iptables): there a dropped first packet shows as a
// connection that failed, the SYN retransmitted after a second and the timeout below that.
func (s *scene) baselineDrops() float64 {
	if s.be.flag != "nftables" {
		return -1
	}
	return s.metric(`netwarden_policy_packets_total{direction="egress",kind="ClusterNetworkPolicy",namespace="",policy="deny-egress",verdict="drop"}`)
}

// metric reads one sample of the agent's /metrics (0 when absent).
func (s *scene) metric(series string) float64 {
	s.t.Helper()
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.sim.StatusSocket())
	}}, Timeout: 10 * time.Second}
	resp, err := hc.Get("http://agent/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// setHolding names the kernel set of a domain (nftables set or ipset) that holds addr.
func (s *scene) setHolding(_ string, addr netip.Addr) string {
	var names [][]string
	if s.be.flag == "nftables" {
		out, err := s.sim.Nft("-j", "list", "table", "inet", "netwarden")
		if err != nil {
			s.t.Fatal(err)
		}
		names = regexp.MustCompile(`"name": "(dom-[a-z0-9]+-v4)"`).FindAllStringSubmatch(out, -1)
	} else {
		out, err := s.node("ipset", "list", "-n")
		if err != nil {
			s.t.Fatal(err)
		}
		names = regexp.MustCompile(`(?m)^(netwarden-d4-\S+)$`).FindAllStringSubmatch(out, -1)
	}
	for _, m := range names {
		if s.setHas(m[1], addr) {
			return m[1]
		}
	}
	return ""
}

func (s *scene) setHas(set string, addr netip.Addr) bool {
	if s.be.flag == "nftables" {
		_, err := s.sim.Nft("get", "element", "inet", "netwarden", set, "{", addr.String(), "}")
		return err == nil
	}
	_, err := s.node("ipset", "test", set, addr.String())
	return err == nil
}

// node runs a command in the node's network namespace.
func (s *scene) node(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", s.sim.Bed.NodeNetNSName()}, args...)...).CombinedOutput()
	return string(out), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
