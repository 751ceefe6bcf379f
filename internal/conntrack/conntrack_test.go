package conntrack

import (
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/nftnl"
	"github.com/netwarden/netwarden/internal/testbed"
)

// TestDeleteMatchesBothFamiliesInOneCall creates UDP conntrack entries over loopback in a
// fresh network namespace (IPv4 and IPv6, two destination ports) and deletes by port, family
// and address, counting what goes.
func TestDeleteMatchesBothFamiliesInOneCall(t *testing.T) {
	testbed.InFreshNetNS(t, func() {
		for _, args := range [][]string{
			{"ip", "link", "set", "lo", "up"},
			// Conntrack tracks a namespace's packets only once a rule there uses it.
			{"nft", "add table inet track; add chain inet track out { type filter hook output priority 0; ct state new accept; }"},
		} {
			if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v %s", args, err, out)
			}
		}
		send := func(to string) {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		// sendFrom uses a source port of its own, so that every call is a new entry.
		sendFrom := func(port int, to string) {
			from := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
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
			send(to)
		}
		sock, err := nftnl.DialRaw()
		if err != nil {
			t.Fatal(err)
		}
		del := func(m Match) int {
			t.Helper()
			n, err := Delete(sock, []Match{m})
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := del(Match{Protocol: unix.IPPROTO_TCP, DstPort: 5000, IPv4: true, IPv6: true}); n != 0 {
			t.Errorf("TCP match deleted %d UDP entries", n)
		}
		if n := del(Match{Protocol: unix.IPPROTO_UDP, DstPort: 5000, Dst: netip.MustParseAddr("127.0.0.2"), IPv4: true}); n != 0 {
			t.Errorf("match for another address deleted %d entries", n)
		}
		if n := del(Match{Protocol: unix.IPPROTO_UDP, DstPort: 5000, IPv4: true, IPv6: true}); n != 2 {
			t.Errorf("port 5000, both families: deleted %d entries, want 2", n)
		}
		if n := del(Match{Protocol: unix.IPPROTO_UDP, DstPort: 6000, IPv6: true}); n != 1 {
			t.Errorf("port 6000, IPv6: deleted %d entries, want 1", n)
		}
		if n := del(Match{Protocol: unix.IPPROTO_UDP, DstPort: 6000, Dst: netip.MustParseAddr("127.0.0.1"), IPv4: true}); n != 1 {
			t.Errorf("port 6000 to 127.0.0.1: deleted %d entries, want 1", n)
		}
		if n := del(Match{Protocol: unix.IPPROTO_UDP, DstPort: 5000, IPv4: true, IPv6: true}); n != 0 {
			t.Errorf("entries deleted twice: %d", n)
		}
		// More entries than one datagram of deletes, or the socket's buffer of their
		// acknowledgements, can hold: a busy UDP host port.
		const many = 700
		for i := range many {
			sendFrom(20000+i, "127.0.0.1:7000")
		}
		if n := del(Match{Protocol: unix.IPPROTO_UDP, DstPort: 7000, IPv4: true}); n != many {
			t.Errorf("port 7000: deleted %d entries, want %d", n, many)
		}
	}, "ip", "nft")
}
