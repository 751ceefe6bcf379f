package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// gen draws random cluster states from a small vocabulary, so that selectors often match
// something and often don't.
type gen struct {
	r *rand.Rand
	w *world
}

var (
	labelKeys   = []string{"app", "tier", "env"}
	labelValues = []string{"a", "b", "c"}
	nsKeys      = []string{"team", "env"}
)

func (g *gen) pick(list []string) string { return list[g.r.IntN(len(list))] }

func (g *gen) labels(keys []string) map[string]string {
	l := map[string]string{}
	for _, k := range keys {
		if g.r.IntN(3) > 0 {
			l[k] = g.pick(labelValues)
		}
	}
	return l
}

func (g *gen) selector(keys []string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	switch g.r.IntN(4) {
	case 0: // empty: everything
	case 1, 2:
		s.MatchLabels = map[string]string{g.pick(keys): g.pick(labelValues)}
	case 3:
		ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
		op := ops[g.r.IntN(len(ops))]
		req := metav1.LabelSelectorRequirement{Key: g.pick(keys), Operator: op}
		if op == metav1.LabelSelectorOpIn || op == metav1.LabelSelectorOpNotIn {
			req.Values = []string{g.pick(labelValues)}
			if g.r.IntN(2) == 0 {
				req.Values = append(req.Values, g.pick(labelValues))
				if req.Values[0] == req.Values[1] {
					req.Values = req.Values[:1]
				}
			}
		}
		s.MatchExpressions = []metav1.LabelSelectorRequirement{req}
	}
	return s
}

func (g *gen) ipBlock() networkingv1.NetworkPolicyPeer {
	keys := sortedKeys(g.w.tpods)
	pod := g.w.tpods[keys[g.r.IntN(len(keys))]]
	ips := pod.IPs()
	ip := ips[g.r.IntN(len(ips))]
	cidr := testbed.DefaultPodCIDRv4
	if ip.Is6() {
		cidr = testbed.DefaultPodCIDRv6
	}
	if !cidr.Contains(ip) {
		// A pod of another node: the except must lie inside the block, or the API server (and
		// the agent, which keeps the file's last good objects) refuses the policy.
		cidr = netip.PrefixFrom(ip, cidr.Bits()-8).Masked()
	}
	switch g.r.IntN(3) {
	case 0:
		return ipPeer(hostPrefix(ip))
	case 1:
		return ipPeer(cidr.String(), hostPrefix(ip))
	default:
		// A narrower block around the pod, with a random bit of it excepted.
		outer := netip.PrefixFrom(ip, ip.BitLen()-2).Masked()
		return ipPeer(outer.String(), netip.PrefixFrom(ip, ip.BitLen()-1).Masked().String())
	}
}

func (g *gen) peer() networkingv1.NetworkPolicyPeer {
	switch g.r.IntN(4) {
	case 0:
		return podPeer(g.selector(labelKeys))
	case 1:
		return nsPeer(g.selector(nsKeys))
	case 2:
		return nsPodPeer(g.selector(nsKeys), g.selector(labelKeys))
	}
	return g.ipBlock()
}

func (g *gen) port() networkingv1.NetworkPolicyPort {
	protos := []corev1.Protocol{tcp, udp, sctp, ""}
	proto := protos[g.r.IntN(len(protos))]
	switch g.r.IntN(5) {
	case 0:
		return port(proto, int32(80+g.r.IntN(2)))
	case 1:
		return portRange(proto, 80, int32(80+g.r.IntN(2)))
	case 2:
		return namedPort(proto, g.pick([]string{"web", "dns", "sig"}))
	case 3:
		if proto == "" {
			proto = tcp
		}
		return anyPort(proto)
	}
	return port(proto, int32(79+g.r.IntN(4)))
}

func (g *gen) policy(i int) *networkingv1.NetworkPolicy {
	ns := g.pick(sortedKeys(g.w.namespaces))
	var types []networkingv1.PolicyType
	switch g.r.IntN(4) {
	case 1:
		types = []networkingv1.PolicyType{ingressType}
	case 2:
		types = []networkingv1.PolicyType{egressType}
	case 3:
		types = []networkingv1.PolicyType{ingressType, egressType}
	}
	np := netpol(ns, fmt.Sprintf("p%d", i), *g.selector(labelKeys), types...)
	for range g.r.IntN(3) {
		var rule networkingv1.NetworkPolicyIngressRule
		for range g.r.IntN(3) {
			rule.From = append(rule.From, g.peer())
		}
		for range g.r.IntN(3) {
			rule.Ports = append(rule.Ports, g.port())
		}
		np.Spec.Ingress = append(np.Spec.Ingress, rule)
	}
	for range g.r.IntN(3) {
		var rule networkingv1.NetworkPolicyEgressRule
		for range g.r.IntN(3) {
			rule.To = append(rule.To, g.peer())
		}
		for range g.r.IntN(3) {
			rule.Ports = append(rule.Ports, g.port())
		}
		np.Spec.Egress = append(np.Spec.Egress, rule)
	}
	return np
}

// randomize relabels every pod and namespace and draws a new set of policies. It walks the
// maps in key order: in Go's random map order, one seed would draw different states.
func (g *gen) randomize() {
	for _, k := range sortedKeys(g.w.namespaces) {
		g.w.namespaces[k].Labels = g.labels(nsKeys)
	}
	for _, k := range sortedKeys(g.w.pods) {
		g.w.pods[k].Labels = g.labels(labelKeys)
	}
	g.w.policies = map[string]*networkingv1.NetworkPolicy{}
	for i := range 1 + g.r.IntN(4) {
		np := g.policy(i)
		g.w.policies[np.Namespace+"/"+np.Name] = np
	}
}

func seed(t *testing.T) uint64 {
	if s := os.Getenv("NETWARDEN_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("NETWARDEN_SEED: %v", err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// rounds is the number of rounds a random run makes: def, or NETWARDEN_ROUNDS when set (to
// drive many rounds from one seed, or to replay a failure up to its round).
func rounds(t *testing.T, def int) int {
	if s := os.Getenv("NETWARDEN_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("NETWARDEN_ROUNDS=%q: want a positive integer", s)
		}
		return v
	}
	return def
}

// TestRandomizedAgainstOracle is the property test: for random namespaces, labels and
// policies, the probed matrix equals the oracle's. Each round is an incremental update of the
// previous one. A failure prints the seed; NETWARDEN_SEED=<seed> replays it, NETWARDEN_ROUNDS=<n>
// sets the number of rounds, and -run picks a subtest, e.g.
// -run 'TestRandomizedAgainstOracle/bridge-v4=false-v6=true/nftables'.
func TestRandomizedAgainstOracle(t *testing.T) {
	for _, tc := range []struct {
		topo   testbed.Topology
		v4, v6 bool
		rounds int
	}{
		{testbed.Routed, true, true, 8},
		{testbed.Bridge, false, true, 5},
	} {
		t.Run(fmt.Sprintf("%s-v4=%v-v6=%v", tc.topo, tc.v4, tc.v6), func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, allBackends, func(t *testing.T, be backend) {
				s := seed(t)
				t.Logf("seed %d (replay with NETWARDEN_SEED=%d)", s, s)
				w := standardWorld(t, be, tc.topo, tc.v4, tc.v6)
				g := &gen{r: rand.New(rand.NewPCG(s, 0x6e6574)), w: w}
				for round := range rounds(t, tc.rounds) {
					g.randomize()
					w.apply(t)
					w.check(t, fmt.Sprintf("seed %d round %d", s, round))
				}
				w.requireIncremental(t)
			})
		})
	}
}
