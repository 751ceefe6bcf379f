package services

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/kubeproxy"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// The cluster's pod range (kube-proxy's --cluster-cidr); each world takes two /24s (/64s) of it.
var clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}

// The Services' ranges, which the nodes route towards their uplink (as a default route would):
// a connection the node itself opens needs a route before kube-proxy's DNAT picks the endpoint.
var serviceRanges = []string{kubetest.ServiceClusterIPRange, "fd00:96::/112"}

// TestServices runs every case for every netwarden backend and kube-proxy mode, each pair in a
// world of its own (a two-node bed, namespace and node names), all reading one API server.
func TestServices(t *testing.T) {
	kerneltest.Require(t, "nft", "iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy", "ipset", "conntrack")
	kubetest.Binary(t, "kube-proxy")
	for _, be := range allBackends {
		agentBinary(t, be)
	}
	srv := kubetest.Start(t, kubetest.Options{ExtraAPIServerArgs: []string{"--service-cluster-ip-range=" + kubetest.DualStackServiceRange}})
	for bi, be := range allBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			for mi, mode := range []kubeproxy.Mode{kubeproxy.NFTables, kubeproxy.IPTables} {
				idx := 2*bi + mi
				t.Run("kube-proxy-"+string(mode), func(t *testing.T) {
					t.Parallel()
					w := newWorld(t, srv, be, mode, idx)
					w.run()
				})
			}
		})
	}
}

// world is one backend x kube-proxy mode: a bed with the local node and a remote one, each
// running kube-proxy and the agent.
type world struct {
	t      *testing.T
	be     backend
	mode   kubeproxy.Mode
	srv    *kubetest.Server
	client kubernetes.Interface
	bed    *testbed.Bed
	local  *testbed.Node
	remote *testbed.Node
	ns     string
	nodes  map[*testbed.Node]string // node -> Node object name
	pods   map[string]*testbed.Pod
	svcs   map[string]*corev1.Service
	rvs    map[string]uint64 // resource -> resourceVersion of the last write
	agents []*nodeAgent
	prox   []*kubeproxy.Proxy
}

func newWorld(t *testing.T, srv *kubetest.Server, be backend, mode kubeproxy.Mode, idx int) *world {
	ctx := context.Background()
	w := &world{t: t, be: be, mode: mode, srv: srv, client: srv.AdminClient(t), ns: fmt.Sprintf("svc-%s-%s", be.name, mode),
		nodes: map[*testbed.Node]string{}, pods: map[string]*testbed.Pod{}, svcs: map[string]*corev1.Service{}, rvs: map[string]uint64{}}
	sub := func(v4 bool, k int) netip.Prefix {
		if v4 {
			return netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", 20+2*idx+k))
		}
		return netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", 20+2*idx+k))
	}
	bed, err := testbed.New(testbed.Config{IPv4: true, IPv6: true, PodCIDRv4: sub(true, 0), PodCIDRv6: sub(false, 0),
		TCPPorts: []uint16{}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Errorf("closing the bed: %v", err)
		}
	})
	w.bed, w.local = bed, bed.LocalNode()
	w.remote, err = bed.AddNodeWithConfig(testbed.NodeConfig{Name: "remote", PodCIDRv4: sub(true, 1), PodCIDRv6: sub(false, 1)})
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.ReplaceAll(be.name+"-"+string(mode), "_", "-")
	w.nodes[w.local] = prefix + "-local"
	w.nodes[w.remote] = prefix + "-remote"
	for _, n := range []*testbed.Node{w.local, w.remote} {
		for _, r := range serviceRanges {
			if out, err := n.Exec(ctx, "ip", "route", "add", r, "dev", testbed.UplinkIfName); err != nil {
				t.Fatalf("route %s in %s: %v %s", r, n.NetNSName, err, out)
			}
		}
		node, err := kubetest.CreateNode(ctx, w.client, w.nodes[n], []netip.Prefix{n.PodCIDRv4, n.PodCIDRv6}, n.UnderlayIPs())
		if err != nil {
			t.Fatal(err)
		}
		w.note("nodes", node)
		serveIdent(t, "node:"+n.Name, n.UnderlayIPs(), n.InNetNSGo)
	}
	w.build(ctx)
	return w
}

// note records the resourceVersion of a write the agents must see.
func (w *world) note(resource string, obj metav1.Object) {
	w.rvs[resource] = max(w.rvs[resource], cluster.ParseResourceVersion(obj.GetResourceVersion()))
}

type podSpec struct {
	name   string
	remote bool
	labels map[string]string
}

// The pods, policies and Services of a world (see the package doc for what each case checks).
var podSpecs = []podSpec{
	{"srv-a", false, map[string]string{"app": "web", "role": "server"}},
	{"srv-c", false, map[string]string{"app": "open"}},
	{"cli-ok", false, map[string]string{"role": "client", "tier": "cli"}},
	{"cli-bad", false, map[string]string{"role": "other", "tier": "cli", "egress": "restricted"}},
	{"hp-ok", false, map[string]string{"app": "hp-ok", "role": "client"}},
	{"hp-bad", false, map[string]string{"app": "hp-bad", "role": "server"}},
	{"srv-b", true, map[string]string{"app": "web", "role": "server"}},
	{"srv-d", true, map[string]string{"app": "np"}},
	{"rcli-ok", true, map[string]string{"role": "client", "tier": "cli"}},
	{"rcli-bad", true, map[string]string{"role": "other", "tier": "cli"}},
}

func (w *world) build(ctx context.Context) {
	t := w.t
	ns, err := w.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.note("namespaces", ns)
	for _, ps := range podSpecs {
		n := w.local
		if ps.remote {
			n = w.remote
		}
		tp, err := n.AddPod(w.ns, ps.name)
		if err != nil {
			t.Fatal(err)
		}
		w.pods[ps.name] = tp
		serveIdent(t, ps.name, tp.IPs(), tp.InNetNSGo)
		pod, err := w.client.CoreV1().Pods(w.ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: ps.name, Labels: ps.labels},
			Spec: corev1.PodSpec{NodeName: w.nodes[n], Containers: []corev1.Container{{Name: "main", Image: "example.invalid/ident",
				Ports: []corev1.ContainerPort{{Name: "ident", ContainerPort: identPort}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, ip := range tp.IPs() {
			ips = append(ips, ip.String())
		}
		running, err := kubetest.SetPodRunning(ctx, w.client, pod, ips...)
		if err != nil {
			t.Fatal(err)
		}
		w.note("pods", running)
	}

	sel := func(kv ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{kv[0]: kv[1]}}
	}
	ipBlocks := func(ips ...netip.Addr) []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for _, ip := range ips {
			out = append(out, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(ip, ip.BitLen()).String()}})
		}
		return out
	}
	policies := []*networkingv1.NetworkPolicy{
		// The servers admit clients (role=client) and the remote node's address.
		{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("role", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "client")}}},
				{From: ipBlocks(w.remote.UnderlayIPs()...)},
			},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hp-ok"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "hp-ok"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "client")}}}},
		}},
		// srv-d admits only the local node's address: what NodePort traffic to it through the
		// local node carries once masqueraded there.
		{ObjectMeta: metav1.ObjectMeta{Name: "np"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "np"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: ipBlocks(w.local.UnderlayIPs()...)}},
		}},
		// The clients admit nothing: the replies to their own connections must still arrive.
		{ObjectMeta: metav1.ObjectMeta{Name: "cli-isolated"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("tier", "cli"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		}},
		// The local bad client may only talk to servers and open pods (not to a node address).
		{ObjectMeta: metav1.ObjectMeta{Name: "bad-egress"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("egress", "restricted"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{PodSelector: sel("role", "server")}, {PodSelector: sel("app", "open")},
			}}},
		}},
	}
	for _, np := range policies {
		np.Namespace = w.ns
		created, err := w.client.NetworkingV1().NetworkPolicies(w.ns).Create(ctx, np, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w.note("networkpolicies", created)
	}

	type svcSpec struct {
		name string
		typ  corev1.ServiceType
		etp  corev1.ServiceExternalTrafficPolicy
		dual bool
		eps  []kubetest.SliceEndpoint
	}
	podEPs := func(names ...string) []kubetest.SliceEndpoint {
		var out []kubetest.SliceEndpoint
		for _, n := range names {
			p := w.pods[n]
			for _, ip := range p.IPs() {
				out = append(out, kubetest.SliceEndpoint{IP: ip, NodeName: w.nodes[p.Node()], PodName: n})
			}
		}
		return out
	}
	for _, s := range []svcSpec{
		{"web-local", corev1.ServiceTypeClusterIP, "", true, podEPs("srv-a")},
		{"web-remote", corev1.ServiceTypeClusterIP, "", true, podEPs("srv-b")},
		{"web-multi", corev1.ServiceTypeClusterIP, "", false, podEPs("srv-a", "srv-b", "srv-c")},
		{"np-cluster", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyCluster, false, podEPs("srv-a")},
		{"np-local", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal, false, podEPs("srv-a")},
		{"np-cluster-remote", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyCluster, false, podEPs("srv-d")},
		{"hp-ok", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyCluster, false, podEPs("hp-ok")},
		{"hp-bad", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyCluster, false, podEPs("hp-bad")},
		// A hostNetwork endpoint: the local node's own address.
		{"host-ep", corev1.ServiceTypeClusterIP, "", false, []kubetest.SliceEndpoint{{IP: w.local.UnderlayIP(4), NodeName: w.nodes[w.local]}}},
	} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: s.name},
			Spec: corev1.ServiceSpec{
				Type:                  s.typ,
				ExternalTrafficPolicy: s.etp,
				Ports:                 []corev1.ServicePort{{Name: "ident", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(identPort)}},
			},
		}
		if s.dual {
			p := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &p
		}
		created, err := w.client.CoreV1().Services(w.ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w.svcs[s.name] = created
		if err := kubetest.ApplyEndpointSlices(ctx, w.client, kubetest.EndpointSlices(created, s.eps...)...); err != nil {
			t.Fatal(err)
		}
	}
}

// startProxies starts kube-proxy on both nodes (created on first use) and waits until the
// kernel of each holds the Services.
func (w *world) startProxies() {
	t := w.t
	if w.prox == nil {
		for _, n := range []*testbed.Node{w.local, w.remote} {
			variant := "nft"
			if w.be.mode == "legacy" {
				variant = "legacy"
			}
			w.prox = append(w.prox, kubeproxy.New(t, kubeproxy.Options{Node: n, NodeName: w.nodes[n], Server: w.srv, Mode: w.mode,
				ClusterCIDRs: clusterCIDRs, IPTablesVariant: variant}))
		}
	}
	for _, p := range w.prox {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	w.waitProxies()
}

func (w *world) waitProxies() {
	for _, p := range w.prox {
		if err := p.WaitProgrammed(90*time.Second, w.client); err != nil {
			w.t.Fatalf("node %s: %v", p.NodeName(), err)
		}
	}
}

// startAgents starts the agent on both nodes and waits until both have applied every write.
func (w *world) startAgents() {
	for _, n := range []*testbed.Node{w.local, w.remote} {
		w.agents = append(w.agents, startAgent(w.t, w.be, w.srv, n, w.nodes[n]))
	}
	for _, a := range w.agents {
		if err := a.waitCovers(60*time.Second, w.rvs); err != nil {
			w.t.Fatal(err)
		}
	}
}

// source is where a probe starts: a pod, or a node's own netns (from its underlay address).
type source struct {
	name string
	run  func(func() error) error
	src  func(fam int) netip.Addr
}

func (w *world) podSrc(name string) source {
	p := w.pods[name]
	return source{name: name, run: p.InNetNSGo, src: p.IP}
}

func (w *world) nodeSrc(n *testbed.Node) source {
	return source{name: "node:" + n.Name, run: n.InNetNSGo, src: n.UnderlayIP}
}

// probeCase is one connection through a Service: allow lists the endpoints whose policy admits
// this client (only they may ever answer), deny those the Service may pick that deny it.
type probeCase struct {
	name  string
	from  source
	dst   netip.AddrPort
	allow []string
	deny  []string
}

func (w *world) clusterIP(svc string, fam int) netip.Addr {
	for _, s := range w.svcs[svc].Spec.ClusterIPs {
		if ip := netip.MustParseAddr(s); (fam == 4) == ip.Is4() {
			return ip
		}
	}
	w.t.Fatalf("service %s has no IPv%d cluster IP", svc, fam)
	return netip.Addr{}
}

// nodePort is the local node's address and svc's NodePort.
func (w *world) nodePort(svc string) netip.AddrPort {
	return netip.AddrPortFrom(w.local.UnderlayIP(4), uint16(w.svcs[svc].Spec.Ports[0].NodePort))
}

func (w *world) cases() []probeCase {
	c := func(name string, from source, dst netip.AddrPort, allow []string, deny ...string) probeCase {
		return probeCase{name: name, from: from, dst: dst, allow: allow, deny: deny}
	}
	ep := func(names ...string) []string { return names }
	cip := func(svc string, fam int) netip.AddrPort { return netip.AddrPortFrom(w.clusterIP(svc, fam), 80) }
	var out []probeCase
	for _, fam := range []int{4, 6} {
		f := fmt.Sprintf("IPv%d ", fam)
		out = append(out,
			c(f+"ClusterIP, endpoint on the same node", w.podSrc("cli-ok"), cip("web-local", fam), ep("srv-a")),
			c(f+"ClusterIP, endpoint on the same node", w.podSrc("cli-bad"), cip("web-local", fam), nil, "srv-a"),
			c(f+"ClusterIP, endpoint on the other node", w.podSrc("cli-ok"), cip("web-remote", fam), ep("srv-b")),
			c(f+"ClusterIP, endpoint on the other node", w.podSrc("cli-bad"), cip("web-remote", fam), nil, "srv-b"),
			c(f+"ClusterIP from the other node's pods", w.podSrc("rcli-ok"), cip("web-local", fam), ep("srv-a")),
			c(f+"ClusterIP from the other node's pods", w.podSrc("rcli-bad"), cip("web-local", fam), nil, "srv-a"),
		)
	}
	out = append(out,
		c("several endpoints", w.podSrc("cli-ok"), cip("web-multi", 4), ep("srv-a", "srv-b", "srv-c")),
		c("several endpoints", w.podSrc("cli-bad"), cip("web-multi", 4), ep("srv-c"), "srv-a", "srv-b"),
	)
	for _, svc := range []string{"np-cluster", "np-local"} {
		out = append(out,
			c("NodePort "+svc+" (client address kept, ipBlock)", w.nodeSrc(w.remote), w.nodePort(svc), ep("srv-a")),
			c("NodePort "+svc+" (client address kept)", w.podSrc("rcli-ok"), w.nodePort(svc), ep("srv-a")),
			c("NodePort "+svc+" (client address kept)", w.podSrc("rcli-bad"), w.nodePort(svc), nil, "srv-a"),
		)
	}
	out = append(out,
		// Through the local node to an endpoint on the other: masqueraded to the local node's
		// address, which the endpoint's policy admits, whoever the client.
		c("NodePort Cluster to the other node (masqueraded)", w.nodeSrc(w.remote), w.nodePort("np-cluster-remote"), ep("srv-d")),
		c("NodePort Cluster to the other node (masqueraded)", w.podSrc("rcli-bad"), w.nodePort("np-cluster-remote"), ep("srv-d")),
		c("hairpin ClusterIP", w.podSrc("hp-ok"), cip("hp-ok", 4), ep("hp-ok")),
		c("hairpin ClusterIP", w.podSrc("hp-bad"), cip("hp-bad", 4), nil, "hp-bad"),
		c("hairpin NodePort", w.podSrc("hp-ok"), w.nodePort("hp-ok"), ep("hp-ok")),
		c("hairpin NodePort", w.podSrc("hp-bad"), w.nodePort("hp-bad"), nil, "hp-bad"),
		// From a node: to its own pods always; to the other node's, as its address is judged.
		c("node -> Service -> pod on the node", w.nodeSrc(w.local), cip("web-local", 4), ep("srv-a")),
		c("node -> Service -> pod on the other node", w.nodeSrc(w.local), cip("web-remote", 4), nil, "srv-b"),
		c("node -> Service -> pod on the other node", w.nodeSrc(w.remote), cip("web-local", 4), ep("srv-a")),
		// A hostNetwork endpoint: the reply to the isolated client is a reply (KNP issue 379).
		c("ClusterIP to a hostNetwork endpoint", w.podSrc("cli-ok"), cip("host-ep", 4), ep("node:local")),
		c("ClusterIP to a hostNetwork endpoint (egress denies the node)", w.podSrc("cli-bad"), cip("host-ep", 4), nil, "node:local"),
	)
	return out
}

func (pc probeCase) String() string {
	return fmt.Sprintf("%s: %s -> %s", pc.name, pc.from.name, pc.dst)
}

// check runs one case and returns what contradicts the policies, or "". A case with one
// possible endpoint connects once (an allowed one gets two more tries: a loaded machine loses
// packets; a denied one that connects fails at once). A case with several connects 36 times
// at once: every answer must come from an endpoint that admits the client, an admitted client
// must always get through, and every admitting endpoint must answer at least once.
func (pc probeCase) check(ctx context.Context) string {
	attempts := 1
	if len(pc.allow)+len(pc.deny) > 1 {
		attempts = 36
	}
	fam := 4
	if pc.dst.Addr().Is6() {
		fam = 6
	}
	src := pc.from.src(fam)
	answers := make([]string, attempts)
	errs := make([]error, attempts)
	var wg sync.WaitGroup
	for i := range attempts {
		wg.Go(func() {
			timeout := time.Second
			for try := 0; ; try++ {
				answers[i], errs[i] = dialIdent(ctx, pc.from.run, src, pc.dst, timeout)
				if errs[i] == nil || len(pc.deny) > 0 || try == 2 {
					return
				}
				timeout = 3 * time.Second
			}
		})
	}
	wg.Wait()
	var problems []string
	seen := map[string]int{}
	for i := range attempts {
		if errs[i] != nil {
			if len(pc.deny) == 0 {
				problems = append(problems, fmt.Sprintf("failed: %v", errs[i]))
			}
			continue
		}
		seen[answers[i]]++
		if !slices.Contains(pc.allow, answers[i]) {
			problems = append(problems, fmt.Sprintf("answered by %s, whose policy denies this client", answers[i]))
		}
	}
	for _, a := range pc.allow {
		if seen[a] == 0 && (attempts > 1 || len(pc.deny) == 0) {
			problems = append(problems, fmt.Sprintf("never reached %s, which admits this client (answers %v)", a, seen))
		}
	}
	slices.Sort(problems)
	problems = slices.Compact(problems)
	if len(problems) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: %s", pc, strings.Join(problems, "; "))
}

// checkAll runs every case in parallel and returns the contradictions, sorted.
func checkAll(ctx context.Context, cases []probeCase) []string {
	res := make([]string, len(cases))
	var wg sync.WaitGroup
	for i, pc := range cases {
		wg.Go(func() { res[i] = pc.check(ctx) })
	}
	wg.Wait()
	var out []string
	for _, r := range res {
		if r != "" {
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) expectAll(ctx context.Context, step string, cases []probeCase) bool {
	w.t.Helper()
	bad := checkAll(ctx, cases)
	if len(bad) > 0 {
		w.t.Errorf("%s: %d of %d cases contradict the policies:\n  %s", step, len(bad), len(cases), strings.Join(bad, "\n  "))
		return false
	}
	return true
}

func (w *world) run() {
	t := w.t
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// 1. kube-proxy first, then the agents.
	w.startProxies()
	w.startAgents()
	cases := w.cases()
	w.expectAll(ctx, "kube-proxy started before the agent", cases)

	// 2. kube-proxy started after the agent: its rules removed (--cleanup), so that it hooks
	// in afresh, after the agent's hooks are in place.
	for _, p := range w.prox {
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := p.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w.startProxies()
	w.expectAll(ctx, "kube-proxy started after the agent", cases)

	// 3. kube-proxy restarted while probes run: every round of probes, before, during and
	// after the restart, holds every verdict.
	var mu sync.Mutex
	var during []string
	rounds := 0
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			bad := checkAll(ctx, cases)
			mu.Lock()
			rounds++
			for _, b := range bad {
				during = append(during, fmt.Sprintf("round %d: %s", rounds, b))
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	for _, p := range w.prox {
		restarted := time.Now()
		if err := p.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitSynced(90*time.Second, restarted); err != nil {
			t.Fatal(err)
		}
	}
	w.waitProxies()
	close(stop)
	<-done
	if len(during) > 0 {
		t.Errorf("kube-proxy restarted while traffic flows: %d contradictions in %d rounds:\n  %s", len(during), rounds, strings.Join(during, "\n  "))
	}
	w.expectAll(ctx, "after kube-proxy restarted", cases)
}
