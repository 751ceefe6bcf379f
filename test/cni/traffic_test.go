package cni_test

import (
	"strings"
	"testing"
)

// TestTraffic is the whole runtime path on each backend: pods ADDed through libcni, reached
// through their host ports from outside, from the node, from another pod and from themselves,
// over IPv4 and IPv6; their traffic out masqueraded; CHECK and STATUS; and after DEL nothing
// answers and no rule is left.
func TestTraffic(t *testing.T) {
	requireKernel(t)
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { testTraffic(t, backend) })
	}
}

func testTraffic(t *testing.T, backend string) {
	n := newNode(t, backend, nil)
	a := n.addPod("a",
		portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
		portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "udp"},
		portMapping{HostPort: 9090, ContainerPort: 80, Protocol: "tcp", HostIP: nodeIP4},
		portMapping{HostPort: 9191, ContainerPort: 80, Protocol: "udp", HostIP: nodeIP6},
	)
	b := n.addPod("b")
	serve(t, n.ext, "ext", 7000)

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []string{nodeIP4, nodeIP6} {
			addr := hostPort(ip, 8080)
			expectReply(t, n.ext, "external", proto, addr, "a", "")
			expectReply(t, n.ns, "node", proto, addr, "a", "")
			expectReply(t, b.ns, "pod b", proto, addr, "a", "")
			// Hairpin: the pod reaches itself through the node, SNATed so the reply comes back.
			expectReply(t, a.ns, "pod a (hairpin)", proto, addr, "a", "")
		}
	}
	// An external client keeps its own address through DNAT.
	expectReply(t, n.ext, "external", "tcp", hostPort(nodeIP4, 8080), "a", extIP4)
	// hostIP mappings answer only on that address.
	expectReply(t, n.ext, "external", "tcp", hostPort(nodeIP4, 9090), "a", "")
	expectNoReply(t, n.ext, "external", "tcp", hostPort(nodeIP4b, 9090))
	expectNoReply(t, n.ext, "external", "tcp", hostPort(nodeIP6, 9090))
	expectReply(t, n.ext, "external", "udp", hostPort(nodeIP6, 9191), "a", "")
	expectNoReply(t, n.ext, "external", "udp", hostPort(nodeIP4, 9191))
	// Localhost is not a host port without the opt-in, and never for IPv6.
	expectNoReply(t, n.ns, "node", "tcp", hostPort("127.0.0.1", 8080))
	expectNoReply(t, n.ns, "node", "tcp", hostPort("::1", 8080))

	// ipmasq: leaving the pod network, pods appear as the node; between pods, as themselves.
	expectReply(t, a.ns, "pod a", "tcp", hostPort(extIP4, 7000), "ext", nodeIP4)
	expectReply(t, b.ns, "pod b", "udp", hostPort(extIP4, 7000), "ext", nodeIP4)
	expectReply(t, a.ns, "pod a", "tcp", hostPort(extIP6, 7000), "ext", nodeIP6)
	expectReply(t, b.ns, "pod b", "tcp", hostPort(a.ip4.String(), 80), "a", b.ip4.String())
	expectReply(t, b.ns, "pod b", "tcp", hostPort(a.ip6.String(), 80), "a", b.ip6.String())

	for _, p := range []*pod{a, b} {
		if err := n.check(p); err != nil {
			t.Errorf("CHECK %s: %v", p.name, err)
		}
	}
	if err := n.inNode(func() error { return n.cfg.GetStatusNetworkList(t.Context(), n.list) }); err != nil {
		t.Errorf("STATUS: %v", err)
	}

	n.del(a)
	for _, proto := range []string{"tcp", "udp"} {
		expectNoReply(t, n.ext, "external after DEL", proto, hostPort(nodeIP4, 8080))
		expectNoReply(t, n.ext, "external after DEL", proto, hostPort(nodeIP6, 8080))
	}
	expectNoReply(t, n.ext, "external after DEL", "tcp", hostPort(nodeIP4, 9090))
	// b is untouched by a's DEL.
	expectReply(t, b.ns, "pod b", "tcp", hostPort(extIP4, 7000), "ext", nodeIP4)
	if err := n.check(b); err != nil {
		t.Errorf("CHECK b after DEL a: %v", err)
	}
	// A repeated DEL, as runtimes do, succeeds.
	n.del(a)
	n.del(b)
	if left := n.natRules(); len(left) > 0 {
		t.Errorf("rules left after DEL of every pod:\n%s", strings.Join(left, "\n"))
	}
}
