package e2e

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// standardWorld builds three namespaces and five local pods. Named ports differ per pod, so a
// named port resolves to different numbers on different destinations.
func standardWorld(t *testing.T, be backend, topo testbed.Topology, v4, v6 bool) *world {
	w := newWorld(t, be, topo, v4, v6)
	w.addNamespace("x", map[string]string{"ns": "x", "team": "blue"})
	w.addNamespace("y", map[string]string{"ns": "y", "team": "red"})
	w.addNamespace("z", map[string]string{"ns": "z"})
	w.addPod(t, "x", "a", map[string]string{"pod": "a", "tier": "web"}, cport("web", 80, tcp), cport("dns", 81, udp), cport("sig", 80, sctp))
	w.addPod(t, "x", "b", map[string]string{"pod": "b", "tier": "db"}, cport("web", 81, tcp), cport("dns", 80, udp), cport("sig", 81, sctp))
	w.addPod(t, "y", "a", map[string]string{"pod": "a", "tier": "web"}, cport("web", 80, tcp), cport("dns", 81, udp))
	w.addPod(t, "y", "b", map[string]string{"pod": "b"}, cport("web", 81, tcp))
	w.addPod(t, "z", "a", map[string]string{"pod": "a", "tier": "cache"})
	if err := w.sim.StartAgent("--resync-period", "2s"); err != nil {
		t.Fatal(err)
	}
	return w
}

type scenario struct {
	name     string
	policies func(w *world) []*networkingv1.NetworkPolicy
}

func hostPrefix(ip netip.Addr) string { return netip.PrefixFrom(ip, ip.BitLen()).String() }

// scenarios covers every networking.k8s.io/v1 semantic point. They run in order against one
// running agent, so each step is also an incremental update of the previous one.
var scenarios = []scenario{
	{"no policies: everything open", func(w *world) []*networkingv1.NetworkPolicy { return nil }},
	{"deny all ingress in x", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{netpol("x", "deny-in", sel())}
	}},
	{"deny all egress in y", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{netpol("y", "deny-out", sel(), egressType)}
	}},
	{"deny both directions, policyTypes explicit, no rules", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{netpol("x", "deny-both", sel("pod", "a"), ingressType, egressType)}
	}},
	{"podSelector alone: same-namespace pods", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{withIngress(netpol("x", "from-b", sel("pod", "a")), from(peers(podPeer(selp("pod", "b")))))}
	}},
	{"namespaceSelector alone", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{withIngress(netpol("x", "from-red", sel()), from(peers(nsPeer(selp("team", "red")))))}
	}},
	{"namespaceSelector and podSelector in one peer", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{withIngress(netpol("x", "from-red-a", sel()), from(peers(nsPodPeer(selp("team", "red"), selp("pod", "a")))))}
	}},
	{"empty selectors: all pods in all namespaces; empty podSelector: all pods of the namespace", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "from-all", sel("pod", "a")), from(peers(nsPodPeer(selp(), selp())))),
			withIngress(netpol("y", "from-own-ns", sel()), from(peers(podPeer(selp())))),
			withIngress(netpol("z", "from-any-b", sel()), from(peers(nsPodPeer(selp(), selp("pod", "b"))))),
		}
	}},
	{"matchExpressions: In, NotIn, Exists, DoesNotExist", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "in", sel("pod", "a")), from(peers(nsPeer(expr("ns", metav1.LabelSelectorOpIn, "y", "z"))))),
			withIngress(netpol("x", "notin", sel("pod", "b")), from(peers(nsPodPeer(selp(), expr("tier", metav1.LabelSelectorOpNotIn, "web"))))),
			withIngress(netpol("y", "exists", sel()), from(peers(nsPodPeer(selp(), expr("tier", metav1.LabelSelectorOpExists))))),
			withEgress(netpol("z", "doesnotexist", sel(), egressType), to(peers(nsPeer(expr("team", metav1.LabelSelectorOpDoesNotExist))))),
		}
	}},
	{"ipBlock with except, both directions and families", func(w *world) []*networkingv1.NetworkPolicy {
		ya := w.tpods["y/a"]
		var ing []networkingv1.NetworkPolicyPeer
		var eg []networkingv1.NetworkPolicyPeer
		for _, pfx := range []netip.Prefix{testbed.DefaultPodCIDRv4, testbed.DefaultPodCIDRv6} {
			for _, ip := range ya.IPs() {
				if ip.Is4() == pfx.Addr().Is4() {
					ing = append(ing, ipPeer(pfx.String(), hostPrefix(ip)))
				}
			}
		}
		for _, ip := range w.tpods["x/b"].IPs() {
			eg = append(eg, ipPeer(hostPrefix(ip)))
		}
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "cidr-in", sel("pod", "a")), from(ing)),
			withEgress(netpol("z", "cidr-out", sel(), egressType), to(eg)),
		}
	}},
	{"ipBlock 0.0.0.0/0 and ::/0: every address of one family", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "all-v4-in", sel()), from(peers(ipPeer("0.0.0.0/0")))),
			withEgress(netpol("y", "all-v6-out", sel("pod", "a"), egressType), to(peers(ipPeer("::/0")))),
			withEgress(withIngress(netpol("z", "all-both", sel(), ingressType, egressType),
				from(peers(ipPeer("::/0")), port(tcp, 80))), to(peers(ipPeer("0.0.0.0/0"), ipPeer("::/0")), port(udp, 81))),
		}
	}},
	{"ipBlock 0.0.0.0/0 and ::/0 with excepts carving out pods", func(w *world) []*networkingv1.NetworkPolicy {
		var ingress, egress []networkingv1.NetworkPolicyPeer
		for _, all := range []string{"0.0.0.0/0", "::/0"} {
			v4 := all == "0.0.0.0/0"
			var in, out []string
			for _, ip := range w.tpods["y/a"].IPs() {
				if ip.Is4() == v4 {
					in = append(in, hostPrefix(ip))
				}
			}
			for _, key := range []string{"x/b", "z/a"} {
				for _, ip := range w.tpods[key].IPs() {
					if ip.Is4() == v4 {
						out = append(out, hostPrefix(ip))
					}
				}
			}
			ingress = append(ingress, ipPeer(all, in...))
			egress = append(egress, ipPeer(all, out...))
		}
		// y's IPv6 egress reaches everything but this node's pod network: the node, and pods
		// on other nodes.
		egressV6Pods := ipPeer("::/0", testbed.DefaultPodCIDRv6.String())
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "all-but-ya", sel()), from(ingress)),
			withEgress(netpol("z", "all-but-xb-za", sel(), egressType), to(egress)),
			withEgress(netpol("y", "v4-or-no-pods-v6", sel(), egressType), to(peers(ipPeer("0.0.0.0/0", hostPrefix(w.tpods["x/a"].IPv4)), egressV6Pods))),
		}
	}},
	{"ports: numeric, missing protocol, endPort range, protocol without port", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "tcp80", sel("pod", "a")), from(nil, port(tcp, 80))),
			withIngress(netpol("x", "default-proto", sel("pod", "b")), from(nil, port("", 81))),
			withIngress(netpol("y", "udp-range", sel()), from(nil, portRange(udp, 80, 81), port(sctp, 81))),
			withEgress(netpol("z", "any-sctp", sel(), egressType), to(nil, anyPort(sctp))),
		}
	}},
	{"named ports resolved per destination pod and protocol (ingress)", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "named-web", sel()), from(nil, namedPort(tcp, "web"), namedPort(udp, "dns"))),
			withIngress(netpol("y", "named-wrong-proto", sel()), from(nil, namedPort(udp, "web"), namedPort(sctp, "sig"))),
		}
	}},
	{"named ports on egress, resolved on the destination pod", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withEgress(netpol("z", "to-web", sel(), egressType), to(peers(nsPodPeer(selp(), selp())), namedPort(tcp, "web"))),
			withEgress(netpol("y", "to-sig", sel("pod", "a"), egressType), to(nil, namedPort(sctp, "sig"), namedPort("", "web"))),
		}
	}},
	{"egress to the node through ipBlock; pod-to-node denied otherwise", func(w *world) []*networkingv1.NetworkPolicy {
		var nodePeers []networkingv1.NetworkPolicyPeer
		for _, ip := range w.sim.Bed.NodeIPs() {
			nodePeers = append(nodePeers, ipPeer(hostPrefix(ip)))
		}
		return []*networkingv1.NetworkPolicy{
			withEgress(netpol("x", "to-node", sel("pod", "a"), egressType), to(nodePeers, port(tcp, 80))),
			netpol("x", "deny-out-b", sel("pod", "b"), egressType),
		}
	}},
	{"several policies on one pod add up; ingress and egress together", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(netpol("x", "p1", sel("pod", "a")), from(peers(nsPeer(selp("ns", "y"))), port(tcp, 80))),
			withIngress(netpol("x", "p2", sel()), from(peers(nsPeer(selp("ns", "z"))), port(udp, 81))),
			withEgress(withIngress(netpol("y", "both", sel("pod", "a"), ingressType, egressType),
				from(peers(podPeer(selp("pod", "b"))))), to(peers(nsPeer(selp("ns", "x"))), port(tcp, 81))),
		}
	}},
	{"policyTypes Egress ignores ingress rules; empty from allows all on ports", func(w *world) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{
			withIngress(withEgress(netpol("x", "egress-only", sel("pod", "a"), egressType), to(peers(nsPeer(selp())))),
				from(peers(podPeer(selp("pod", "nothing"))))),
			withIngress(netpol("y", "empty-from", sel()), from([]networkingv1.NetworkPolicyPeer{}, port(tcp, 81))),
		}
	}},
	{"all policies removed again", func(w *world) []*networkingv1.NetworkPolicy { return nil }},
}

func runScenarios(t *testing.T, w *world) {
	for _, sc := range scenarios {
		w.policies = map[string]*networkingv1.NetworkPolicy{}
		for _, np := range sc.policies(w) {
			w.policies[np.Namespace+"/"+np.Name] = np
		}
		w.apply(t)
		w.check(t, sc.name)
	}
	w.requireIncremental(t)
}

func TestSemanticsRoutedDualStack(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		runScenarios(t, standardWorld(t, be, testbed.Routed, true, true))
	})
}

func TestSemanticsBridgeDualStack(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		runScenarios(t, standardWorld(t, be, testbed.Bridge, true, true))
	})
}

// TestRemotePeers runs every scenario with pods on a second node as well: every pod in the
// cluster is a peer, and traffic between nodes is judged here on the local side.
func TestRemotePeers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := standardWorld(t, be, testbed.Routed, true, true)
		w.addRemotePod(t, "x", "r1", map[string]string{"pod": "a", "tier": "web"}, cport("web", 81, tcp), cport("dns", 80, udp))
		w.addRemotePod(t, "z", "r2", map[string]string{"pod": "b"}, cport("sig", 81, sctp))
		runScenarios(t, w)
	})
}

// TestMultiNode runs an agent on each of several nodes against the same cluster state: ingress
// is enforced on the destination node and egress on the source node, for every scenario. A
// node added later, with its own pod CIDR and pods, is picked up by every agent.
func TestMultiNode(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := standardWorld(t, be, testbed.Routed, true, true)
		w.startAgentOn(t, "node-2")
		w.addPodOn(t, "node-2", "x", "r1", map[string]string{"pod": "a", "tier": "web"}, cport("web", 81, tcp), cport("dns", 80, udp))
		w.addPodOn(t, "node-2", "z", "r2", map[string]string{"pod": "b"}, cport("sig", 81, sctp))
		runScenarios(t, w)

		w.startAgentOn(t, "node-3")
		w.addPodOn(t, "node-3", "y", "r3", map[string]string{"pod": "a"}, cport("web", 80, tcp))
		w.policies = map[string]*networkingv1.NetworkPolicy{}
		for _, np := range []*networkingv1.NetworkPolicy{
			withIngress(netpol("y", "from-x-web", sel("pod", "a")), from(peers(nsPodPeer(selp("ns", "x"), selp("tier", "web"))), namedPort(tcp, "web"))),
			withEgress(netpol("z", "only-y", sel(), egressType), to(peers(nsPeer(selp("ns", "y"))))),
		} {
			w.policies[np.Namespace+"/"+np.Name] = np
		}
		w.apply(t)
		w.check(t, "third node added later")
	})
}
