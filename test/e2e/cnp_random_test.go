package e2e

// The property test of ClusterNetworkPolicy: random ClusterNetworkPolicies of both tiers (every
// action; subjects, peers of every kind, port numbers, ranges and named ports; networks that
// cover pod and node addresses; priorities that tie) and random NetworkPolicies, over randomly
// labelled namespaces, pods and nodes, probed against the oracle.

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// cnpGen draws random cluster states for a cnpWorld, with gen's vocabulary for labels and
// selectors (and its NetworkPolicies).
type cnpGen struct {
	*gen
	c *cnpCluster
}

var nodeZones = []string{"a", "b"}

func (g *cnpGen) action() npav1beta1.ClusterNetworkPolicyRuleAction {
	return []npav1beta1.ClusterNetworkPolicyRuleAction{npav1beta1.ClusterNetworkPolicyRuleActionAccept,
		npav1beta1.ClusterNetworkPolicyRuleActionDeny, npav1beta1.ClusterNetworkPolicyRuleActionPass}[g.r.IntN(3)]
}

func (g *cnpGen) namespacedPod() *npav1beta1.NamespacedPod {
	return &npav1beta1.NamespacedPod{NamespaceSelector: *g.selector(nsKeys), PodSelector: *g.selector(labelKeys)}
}

func (g *cnpGen) nodeSelector() *metav1.LabelSelector {
	switch g.r.IntN(5) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"zone": g.pick(nodeZones)}}
	case 2:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/hostname": g.pick(sortedKeys(g.c.Nodes))}}
	case 3:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/os": "linux"}}
	}
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpNotIn, Values: []string{g.pick(nodeZones)}}}}
}

// cidr draws a network: a pod's or a node's address alone, a block around a pod, a node's pod
// CIDR, the cluster's pod range, or everything of one family.
func (g *cnpGen) cidr() npav1beta1.CIDR {
	var addrs []netip.Addr
	for _, k := range sortedKeys(g.c.Pods) {
		addrs = append(addrs, podAddrs(g.c.Pods[k])...)
	}
	for _, k := range sortedKeys(g.c.Nodes) {
		addrs = append(addrs, nodeAddrs(g.c.Nodes[k])...)
	}
	ip := addrs[g.r.IntN(len(addrs))]
	switch g.r.IntN(6) {
	case 0, 1:
		return npav1beta1.CIDR(netip.PrefixFrom(ip, ip.BitLen()).String())
	case 2:
		return npav1beta1.CIDR(netip.PrefixFrom(ip, ip.BitLen()-2).Masked().String())
	case 3:
		var cidrs []string
		for _, k := range sortedKeys(g.c.Nodes) {
			cidrs = append(cidrs, g.c.Nodes[k].Spec.PodCIDRs...)
		}
		return npav1beta1.CIDR(g.pick(cidrs))
	case 4:
		return npav1beta1.CIDR(g.pick([]string{"10.244.0.0/16", "fd00:10:244::/48", "10.0.0.0/8", "fd00::/8"}))
	}
	return npav1beta1.CIDR(g.pick([]string{"0.0.0.0/0", "::/0"}))
}

func (g *cnpGen) egressPeer(a npav1beta1.ClusterNetworkPolicyRuleAction) npav1beta1.ClusterNetworkPolicyEgressPeer {
	switch g.r.IntN(9) {
	case 0, 1:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Namespaces: g.selector(nsKeys)}
	case 2, 3:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Pods: g.namespacedPod()}
	case 4, 5:
		p := npav1beta1.ClusterNetworkPolicyEgressPeer{Networks: []npav1beta1.CIDR{g.cidr()}}
		if g.r.IntN(2) == 0 {
			if c := g.cidr(); c != p.Networks[0] {
				p.Networks = append(p.Networks, c)
			}
		}
		return p
	case 6, 7:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Nodes: g.nodeSelector()}
	}
	if a == npav1beta1.ClusterNetworkPolicyRuleActionAccept {
		// A peer this agent does not implement: under Accept, it matches nothing.
		return npav1beta1.ClusterNetworkPolicyEgressPeer{DomainNames: []npav1beta1.DomainName{"example.com"}}
	}
	return npav1beta1.ClusterNetworkPolicyEgressPeer{Namespaces: g.selector(nsKeys)}
}

func (g *cnpGen) port() *npav1beta1.Port {
	if g.r.IntN(2) == 0 {
		return &npav1beta1.Port{Number: int32(79 + g.r.IntN(4))}
	}
	start := int32(79 + g.r.IntN(3))
	return &npav1beta1.Port{Range: &npav1beta1.PortRange{Start: start, End: start + 1 + int32(g.r.IntN(2))}}
}

// protocols draws a rule's protocols: none (all traffic), or one or two entries. Named ports
// only where the API allows them (not with networks or nodes peers).
func (g *cnpGen) protocols(named bool) []npav1beta1.ClusterNetworkPolicyProtocol {
	if g.r.IntN(3) == 0 {
		return nil
	}
	var out []npav1beta1.ClusterNetworkPolicyProtocol
	for range 1 + g.r.IntN(2) {
		var p npav1beta1.ClusterNetworkPolicyProtocol
		switch k := g.r.IntN(4); {
		case k == 3 && named:
			p.DestinationNamedPort = g.pick([]string{"web", "dns", "sig", "none"})
		case k == 0:
			p.TCP = &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: g.port()}
		case k == 1:
			p.UDP = &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: g.port()}
		default:
			p.SCTP = &npav1beta1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: g.port()}
		}
		out = append(out, p)
	}
	return out
}

func (g *cnpGen) cnp(name string) *npav1beta1.ClusterNetworkPolicy {
	cnp := &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	cnp.Spec.Tier = npav1beta1.AdminTier
	if g.r.IntN(2) == 0 {
		cnp.Spec.Tier = npav1beta1.BaselineTier
	}
	cnp.Spec.Priority = int32(g.r.IntN(3)) // small: ties are common
	if g.r.IntN(2) == 0 {
		cnp.Spec.Subject.Namespaces = g.selector(nsKeys)
	} else {
		cnp.Spec.Subject.Pods = g.namespacedPod()
	}
	for i := range g.r.IntN(4) {
		r := npav1beta1.ClusterNetworkPolicyIngressRule{Name: fmt.Sprintf("in-%d", i), Action: g.action()}
		for range 1 + g.r.IntN(2) {
			if g.r.IntN(2) == 0 {
				r.From = append(r.From, npav1beta1.ClusterNetworkPolicyIngressPeer{Namespaces: g.selector(nsKeys)})
			} else {
				r.From = append(r.From, npav1beta1.ClusterNetworkPolicyIngressPeer{Pods: g.namespacedPod()})
			}
		}
		r.Protocols = g.protocols(true)
		cnp.Spec.Ingress = append(cnp.Spec.Ingress, r)
	}
	for i := range g.r.IntN(4) {
		r := npav1beta1.ClusterNetworkPolicyEgressRule{Name: fmt.Sprintf("out-%d", i), Action: g.action()}
		named := true
		for range 1 + g.r.IntN(2) {
			p := g.egressPeer(r.Action)
			if p.Networks != nil || p.Nodes != nil || p.DomainNames != nil {
				named = false
			}
			r.To = append(r.To, p)
		}
		r.Protocols = g.protocols(named)
		cnp.Spec.Egress = append(cnp.Spec.Egress, r)
	}
	return cnp
}

// randomize relabels namespaces, pods (host network ones too) and nodes, and draws new
// ClusterNetworkPolicies and NetworkPolicies, walking maps in key order so one seed always
// draws the same state.
func (g *cnpGen) randomize() {
	c := g.c
	for _, k := range sortedKeys(c.Namespaces) {
		c.Namespaces[k].Labels = g.labels(nsKeys)
	}
	for _, k := range sortedKeys(c.Pods) {
		c.Pods[k].Labels = g.labels(labelKeys)
	}
	for _, k := range sortedKeys(c.Nodes) {
		c.Nodes[k].Labels["zone"] = g.pick(nodeZones)
	}
	clear(c.CNPs)
	names := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot"}
	g.r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for _, name := range names[:1+g.r.IntN(5)] {
		c.CNPs[name] = g.cnp(name)
	}
	clear(c.NPs)
	for i := range g.r.IntN(3) {
		np := g.policy(i)
		c.NPs[np.Namespace+"/"+np.Name] = np
	}
}

// randomPods are the pods of the random worlds: namespaces x, y, z; pods on both nodes with
// named ports that differ per pod, and a host network pod on node-2.
var randomPods = []struct {
	ns, name, node string // node: "" for the agent's own node
	hostNetwork    bool
	ports          []corev1.ContainerPort
}{
	{"x", "a", "", false, []corev1.ContainerPort{cport("web", 80, tcp), cport("dns", 81, udp), cport("sig", 80, sctp)}},
	{"x", "b", "", false, []corev1.ContainerPort{cport("web", 81, tcp), cport("dns", 80, udp), cport("sig", 81, sctp)}},
	{"y", "a", "", false, []corev1.ContainerPort{cport("web", 80, tcp), cport("dns", 81, udp)}},
	{"z", "a", "", false, nil},
	{"x", "c", "node-2", false, []corev1.ContainerPort{cport("web", 81, tcp), cport("dns", 80, udp)}},
	{"y", "b", "node-2", false, []corev1.ContainerPort{cport("sig", 80, sctp), cport("web", 80, tcp)}},
	{"z", "h", "node-2", true, []corev1.ContainerPort{cport("web", 80, tcp)}},
}

// addRandomPods adds the namespaces and pods of the random worlds to c, placed by place.
func addRandomPods(c *cnpCluster, local string, place func(ns, name, node string, hostNetwork bool) ([]netip.Addr, error)) error {
	for _, ns := range []string{"x", "y", "z"} {
		c.Namespaces[ns] = testNamespace(ns)
	}
	for _, p := range randomPods {
		node := p.node
		if node == "" {
			node = local
		}
		ips, err := place(p.ns, p.name, node, p.hostNetwork)
		if err != nil {
			return err
		}
		c.Pods[p.ns+"/"+p.name] = testPod(p.ns, p.name, node, p.hostNetwork, ips, p.ports)
	}
	return nil
}

func newRandomCNPWorld(t *testing.T, be backend, topo testbed.Topology) *cnpWorld {
	w := newCNPBed(t, be, topo, nil, nil, nil) // the bed's default ports, 80 and 81
	if err := addRandomPods(w.c, w.sim.NodeName, w.place); err != nil {
		t.Fatal(err)
	}
	w.start(t)
	return w
}

func testNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func testPod(ns, name, node string, hostNetwork bool, ips []netip.Addr, ports []corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: hostNetwork,
			Containers: []corev1.Container{{Name: "main", Image: "example.invalid/server", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0].String()
	}
	return p
}

var (
	randomPodPorts  = []cnpPort{{testbed.TCP, 80}, {testbed.TCP, 81}, {testbed.UDP, 80}, {testbed.UDP, 81}, {testbed.SCTP, 80}, {testbed.SCTP, 81}}
	randomNodePorts = []cnpPort{{testbed.TCP, 80}, {testbed.UDP, 81}, {testbed.SCTP, 80}}
)

// TestCNPRandomizedAgainstOracle: for random ClusterNetworkPolicies, NetworkPolicies and labels,
// the matrix (every pod to every other pod on TCP, UDP and SCTP 80 and 81, and to every node
// address) in both families equals the oracle's. Each round is an incremental update of the one
// before. Every world prints its seed; NETWARDEN_SEED=<seed> replays it, NETWARDEN_ROUNDS=<n>
// sets the number of rounds, and -run picks the world, e.g.
// -run 'TestCNPRandomizedAgainstOracle/routed/nftables'.
func TestCNPRandomizedAgainstOracle(t *testing.T) {
	t.Parallel()
	runCNPWorlds(t, allCNPCombos(), func(t *testing.T, c cnpCombo) {
		n := 8
		if c.topo == testbed.Bridge {
			n = 5
		}
		s := seed(t)
		t.Logf("seed %d (replay with NETWARDEN_SEED=%d -run 'TestCNPRandomizedAgainstOracle/%s/%s')", s, s, c.topo, c.be.name)
		w := newRandomCNPWorld(t, c.be, c.topo)
		g := &cnpGen{gen: &gen{r: rand.New(rand.NewPCG(s, 0x636e70)), w: &world{namespaces: w.c.Namespaces, tpods: w.tpods}}, c: w.c}
		for round := range rounds(t, n) {
			g.randomize()
			w.sync(t, "policies.yaml")
			step := fmt.Sprintf("seed %d round %d", s, round)
			r := w.check(t, step, w.matrix(newCNPOracle(w.c), randomPodPorts, randomNodePorts))
			w.requireNoReject(t, step)
			if t.Failed() {
				t.Fatalf("%s: the policies:\n%s\nthe labels:\n%s", step, w.policyYAML(t), w.labelSummary())
			}
			t.Logf("%s: %d probes match the oracle (%d allowed, %d denied)", step, r.probes, r.allowed, r.denied)
		}
		w.requireNoFallback(t)
	})
}

// labelSummary lists the labels of namespaces, pods and nodes, for failure messages.
func (w *cnpWorld) labelSummary() string {
	var out string
	for _, k := range sortedKeys(w.c.Namespaces) {
		out += fmt.Sprintf("  namespace %s %v\n", k, w.c.Namespaces[k].Labels)
	}
	for _, k := range sortedKeys(w.c.Pods) {
		p := w.c.Pods[k]
		out += fmt.Sprintf("  pod %s %v on %s %v hostNetwork=%v\n", k, p.Labels, p.Spec.NodeName, podAddrs(p), p.Spec.HostNetwork)
	}
	for _, k := range sortedKeys(w.c.Nodes) {
		out += fmt.Sprintf("  node %s %v %v\n", k, w.c.Nodes[k].Labels, nodeAddrs(w.c.Nodes[k]))
	}
	return out
}

// TestCNPRandomGenerator checks, with no kernel, that the random test draws every feature it
// claims to (tiers, actions, subject and peer kinds, port kinds, priority ties, NetworkPolicies)
// and that its states reach every tier's decision in the oracle, allowed and denied.
func TestCNPRandomGenerator(t *testing.T) {
	node1, node2, place := fakeNodes()
	c := newCNPCluster()
	c.Nodes[node1.Name], c.Nodes[node2.Name] = node1, node2
	if err := addRandomPods(c, node1.Name, place); err != nil {
		t.Fatal(err)
	}
	tpods := map[string]*testbed.Pod{}
	for k, p := range c.Pods {
		if !p.Spec.HostNetwork {
			tp := &testbed.Pod{Namespace: p.Namespace, Name: p.Name}
			for _, ip := range podAddrs(p) {
				if ip.Is4() {
					tp.IPv4 = ip
				} else {
					tp.IPv6 = ip
				}
			}
			tpods[k] = tp
		}
	}
	g := &cnpGen{gen: &gen{r: rand.New(rand.NewPCG(1, 2)), w: &world{namespaces: c.Namespaces, tpods: tpods}}, c: c}
	seen := map[string]int{}
	for range 200 {
		g.randomize()
		prio := map[string]bool{}
		for _, cnp := range c.CNPs {
			seen["tier "+string(cnp.Spec.Tier)]++
			key := fmt.Sprintf("%s/%d", cnp.Spec.Tier, cnp.Spec.Priority)
			if prio[key] {
				seen["priority tie"]++
			}
			prio[key] = true
			if cnp.Spec.Subject.Namespaces != nil {
				seen["subject namespaces"]++
			} else {
				seen["subject pods"]++
			}
			protos := func(ps []npav1beta1.ClusterNetworkPolicyProtocol) {
				if len(ps) == 0 {
					seen["protocols none"]++
				}
				for _, p := range ps {
					for _, dp := range []*npav1beta1.Port{tcpPort(p.TCP), udpPort(p.UDP), sctpPort(p.SCTP)} {
						if dp != nil && dp.Range != nil {
							seen["port range"]++
						} else if dp != nil {
							seen["port number"]++
						}
					}
					if p.TCP != nil {
						seen["tcp"]++
					}
					if p.UDP != nil {
						seen["udp"]++
					}
					if p.SCTP != nil {
						seen["sctp"]++
					}
					if p.DestinationNamedPort != "" {
						seen["named port"]++
					}
				}
			}
			for _, r := range cnp.Spec.Ingress {
				seen["action "+string(r.Action)]++
				for _, p := range r.From {
					if p.Namespaces != nil {
						seen["ingress namespaces"]++
					}
					if p.Pods != nil {
						seen["ingress pods"]++
					}
				}
				protos(r.Protocols)
			}
			for _, r := range cnp.Spec.Egress {
				seen["action "+string(r.Action)]++
				for _, p := range r.To {
					switch {
					case p.Namespaces != nil:
						seen["egress namespaces"]++
					case p.Pods != nil:
						seen["egress pods"]++
					case p.Networks != nil:
						seen["egress networks"]++
					case p.Nodes != nil:
						seen["egress nodes"]++
					case p.DomainNames != nil:
						seen["egress domainNames (unknown peer)"]++
					}
				}
				protos(r.Protocols)
			}
		}
		if len(c.NPs) > 0 {
			seen["NetworkPolicy"]++
		}
		o := newCNPOracle(c)
		for _, src := range sortedKeys(tpods) {
			for _, dst := range sortedKeys(c.Pods) {
				if src == dst {
					continue
				}
				for _, d := range podAddrs(c.Pods[dst]) {
					s := tpods[src].IP(familyOf(d))
					v := o.Judge(cnpConn{SrcIP: s, DstIP: d, Proto: corev1.ProtocolTCP, Port: 80})
					for _, dec := range []cnpDecision{v.Egress, v.Ingress} {
						seen[fmt.Sprintf("decided by %q %s", dec.Tier, verdict(dec.Allowed))]++
					}
				}
			}
		}
	}
	for _, want := range []string{"tier Admin", "tier Baseline", "priority tie", "subject namespaces", "subject pods",
		"action Accept", "action Deny", "action Pass", "ingress namespaces", "ingress pods", "egress namespaces",
		"egress pods", "egress networks", "egress nodes", "egress domainNames (unknown peer)", "protocols none",
		"tcp", "udp", "sctp", "port number", "port range", "named port", "NetworkPolicy",
		`decided by "Admin" allowed`, `decided by "Admin" blocked`, `decided by "NetworkPolicy" allowed`,
		`decided by "NetworkPolicy" blocked`, `decided by "Baseline" allowed`, `decided by "Baseline" blocked`,
		`decided by "" allowed`} {
		if seen[want] == 0 {
			t.Errorf("200 random states never had %s", want)
		}
	}
	t.Logf("%v", seen)
}

func tcpPort(p *npav1beta1.ClusterNetworkPolicyProtocolTCP) *npav1beta1.Port {
	if p == nil {
		return nil
	}
	return p.DestinationPort
}

func udpPort(p *npav1beta1.ClusterNetworkPolicyProtocolUDP) *npav1beta1.Port {
	if p == nil {
		return nil
	}
	return p.DestinationPort
}

func sctpPort(p *npav1beta1.ClusterNetworkPolicyProtocolSCTP) *npav1beta1.Port {
	if p == nil {
		return nil
	}
	return p.DestinationPort
}
