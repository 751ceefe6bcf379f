package conntrack

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

// TestDelete creates UDP conntrack entries over loopback in a fresh network namespace (IPv4
// and IPv6, two destination ports) and deletes by port, family and address, counting what is
// left. It runs on both ways of deleting: the kernel's filtered flush and the dump walk.
func TestDelete(t *testing.T) {
	for _, path := range []struct {
		name string
		del  func(*nftnl.Raw, []Match) error
	}{
		{"filtered-flush", flush},
		{"dump", func(sock *nftnl.Raw, m []Match) error { _, err := deleteByDump(sock, m); return err }},
	} {
		t.Run(path.name, func(t *testing.T) { testDelete(t, path.name, path.del) })
	}
}

func testDelete(t *testing.T, path string, del func(*nftnl.Raw, []Match) error) {
	kerneltest.InFreshNetNS(t, func() {
		for _, args := range [][]string{
			{"ip", "link", "set", "lo", "up"},
			// Conntrack tracks a namespace's packets only once a rule there uses it.
			{"nft", "add table inet track; add chain inet track out { type filter hook output priority 0; ct state new accept; }"},
		} {
			if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v %s", args, err, out)
			}
		}
		// send writes one datagram from fromPort (0: an ephemeral port); a source port of its
		// own makes every call a new entry.
		send := func(fromPort int, to string) {
			var from *net.UDPAddr
			if fromPort != 0 {
				from = net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(fromPort)))
			}
			c, err := net.DialUDP("udp", from, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		for _, to := range []string{"127.0.0.1:5000", "[::1]:5000", "127.0.0.1:6000", "[::1]:6000"} {
			send(0, to)
		}
		sock, err := nftnl.DialRaw()
		if err != nil {
			t.Fatal(err)
		}
		// left counts the UDP entries per destination port and family.
		left := func() map[string]int {
			t.Helper()
			entries, err := dump(sock)
			if err != nil {
				t.Fatal(err)
			}
			n := map[string]int{}
			for _, e := range entries {
				if e.proto == unix.IPPROTO_UDP {
					n[fmt.Sprintf("%d/%d", e.dstPort, e.family)]++
				}
			}
			return n
		}
		const v4, v6 = unix.AF_INET, unix.AF_INET6
		key := func(port, family int) string { return fmt.Sprintf("%d/%d", port, family) }
		want := map[string]int{key(5000, v4): 1, key(5000, v6): 1, key(6000, v4): 1, key(6000, v6): 1}
		step := func(what string, m Match, gone ...string) {
			t.Helper()
			if err := del(sock, []Match{m}); err != nil {
				if path == "filtered-flush" && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
					t.Skipf("this kernel does not take a filter on a conntrack flush (%v); Delete falls back to the dump walk, tested beside this", err)
				}
				t.Fatalf("%s: %v", what, err)
			}
			for _, k := range gone {
				delete(want, k)
			}
			if got := left(); !maps.Equal(got, want) {
				t.Errorf("after deleting %s: entries %v, want %v", what, got, want)
			}
		}
		step("TCP to 5000", Match{Protocol: unix.IPPROTO_TCP, DstPort: 5000, IPv4: true, IPv6: true})
		step("UDP to 127.0.0.2:5000", Match{Protocol: unix.IPPROTO_UDP, DstPort: 5000, Dst: netip.MustParseAddr("127.0.0.2"), IPv4: true})
		step("UDP to 5000, both families", Match{Protocol: unix.IPPROTO_UDP, DstPort: 5000, IPv4: true, IPv6: true}, key(5000, v4), key(5000, v6))
		step("UDP to 6000, IPv6", Match{Protocol: unix.IPPROTO_UDP, DstPort: 6000, IPv6: true}, key(6000, v6))
		step("UDP to 127.0.0.1:6000", Match{Protocol: unix.IPPROTO_UDP, DstPort: 6000, Dst: netip.MustParseAddr("127.0.0.1"), IPv4: true}, key(6000, v4))
		step("UDP to 5000 again", Match{Protocol: unix.IPPROTO_UDP, DstPort: 5000, IPv4: true, IPv6: true})
		// More entries than one datagram of deletes, or the socket's buffer of their
		// acknowledgements, can hold: a busy UDP host port.
		const many = 700
		for i := range many {
			send(20000+i, "127.0.0.1:7000")
		}
		want[key(7000, v4)] = many
		send(0, "127.0.0.1:7001")
		want[key(7001, v4)] = 1
		if got := left(); !maps.Equal(got, want) {
			t.Fatalf("entries %v, want %v", got, want)
		}
		step("UDP to 7000", Match{Protocol: unix.IPPROTO_UDP, DstPort: 7000, IPv4: true}, key(7000, v4))
	}, "ip", "nft")
}
