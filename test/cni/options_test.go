package cni_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// TestOptions: the portmap options change what answers, on each backend.
func TestOptions(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		web := portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}
		t.Run("localhostHostPorts", func(t *testing.T) {
			n := newNode(t, backend, map[string]any{"localhostHostPorts": true})
			n.addPod("a", web, portMapping{HostPort: 8088, ContainerPort: 80, Protocol: "tcp", HostIP: "127.0.0.1"})
			expectReply(t, n.ns, "node", "tcp", hostPort("127.0.0.1", 8080), "a", "")
			expectReply(t, n.ns, "node", "tcp", hostPort("127.0.0.1", 8088), "a", "")
			expectNoReply(t, n.ext, "external", "tcp", hostPort(nodeIP4, 8088))
			expectNoReply(t, n.ns, "node", "tcp", hostPort("::1", 8080))
		})
		t.Run("conditions", func(t *testing.T) {
			conds := map[string]any{"conditionsV4": []string{"ip saddr != " + extIP4}}
			if backend != "nftables" {
				conds = map[string]any{"conditionsV4": []string{"!", "-s", extIP4 + "/32"}}
			}
			n := newNode(t, backend, conds)
			a := n.addPod("a", web)
			expectNoReply(t, n.ext, "external (excluded by conditionsV4)", "tcp", hostPort(nodeIP4, 8080))
			expectReply(t, n.ns, "node", "tcp", hostPort(nodeIP4, 8080), "a", "")
			expectReply(t, n.ext, "external over IPv6", "tcp", hostPort(nodeIP6, 8080), "a", "")
			if err := n.check(a); err != nil {
				t.Errorf("CHECK with conditions: %v", err)
			}
		})
		t.Run("snat=false", func(t *testing.T) {
			n := newNode(t, backend, map[string]any{"snat": false})
			a := n.addPod("a", web)
			expectReply(t, n.ext, "external", "tcp", hostPort(nodeIP4, 8080), "a", extIP4)
			// Without SNAT the pod answers its own hairpin connection directly, which its
			// socket does not recognise: the connection fails.
			expectNoReply(t, a.ns, "pod a (hairpin without SNAT)", "tcp", hostPort(nodeIP4, 8080))
		})
		t.Run("masqAll", func(t *testing.T) {
			n := newNode(t, backend, map[string]any{"masqAll": true})
			n.addPod("a", web)
			expectReply(t, n.ext, "external", "tcp", hostPort(nodeIP4, 8080), "a", "10.88.0.1")
		})
	})
	t.Run("automatic backend", func(t *testing.T) {
		n := newNode(t, "", nil)
		n.addPod("a", portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
		expectReply(t, n.ext, "external", "tcp", hostPort(nodeIP4, 8080), "a", "")
		// nft works in the node, so the choice is nftables, as the agent's.
		if out, err := shErr(n.ns, "nft", "list", "chains", "inet"); err != nil || !strings.Contains(out, "pm-"+att("ctr-a").ID()) {
			t.Errorf("automatic backend did not choose nftables: %v\n%s", err, out)
		}
	})
}

// TestUDPConntrackFlush: a UDP flow that keeps sending through ADD and DEL follows the mapping,
// because both flush the stale conntrack entries of the host port.
func TestUDPConntrackFlush(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		serve(t, n.ns, "node", 5000) // the node's own server on the port, before any mapping
		var c *net.UDPConn
		err := n.ext.Do(func(ns.NetNS) error {
			var err error
			c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(extIP4+":40001")),
				net.UDPAddrFromAddrPort(netip.MustParseAddrPort(nodeIP4+":5000")))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// ask sends from the same socket, so every datagram belongs to one conntrack entry.
		ask := func(want, when string) {
			t.Helper()
			// A reply to an earlier, retried ping may still be queued (or arrive late) on a
			// busy machine; it belongs to the state before this step, so drop it first.
			buf := make([]byte, 64)
			for {
				c.SetDeadline(time.Now().Add(50 * time.Millisecond))
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
			var got string
			for range 3 {
				c.SetDeadline(time.Now().Add(time.Second))
				if _, err := c.Write([]byte("ping")); err != nil {
					continue
				}
				if k, err := c.Read(buf); err == nil {
					got = string(buf[:k])
					break
				}
			}
			if !strings.HasPrefix(got, want+" ") {
				t.Errorf("%s: UDP flow answered by %q, want %s", when, got, want)
			}
		}
		ask("node", "before ADD")
		p := n.addPod("c", portMapping{HostPort: 5000, ContainerPort: 80, Protocol: "udp"})
		ask("c", "after ADD")
		n.del(p)
		ask("node", "after DEL")
	})
}
