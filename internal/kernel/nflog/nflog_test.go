package nflog

import (
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

// TestReceive logs UDP packets over loopback of both families to a group and reads them
// back: prefix, addresses, protocol and ports as sent, and nothing from another group.
func TestReceive(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		script := `table inet t {
	chain out {
		type filter hook output priority 0;
		udp dport 9 log prefix "nw:test" group 7 drop
		udp dport 10 log prefix "other" group 8 drop
	}
}`
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		c, err := Open(7)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // again, when the test ends early; a second Close only fails
		if _, err := Open(7); err == nil || !strings.Contains(err.Error(), "one reader per group") {
			t.Fatalf("a second reader of group 7: %v, want an error saying the group is taken", err)
		}
		send := func(dst string, port uint16) netip.AddrPort {
			t.Helper()
			conn, err := net.Dial("udp", net.JoinHostPort(dst, itoa(port)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte("x")); err != nil && !strings.Contains(err.Error(), "not permitted") {
				t.Fatal(err)
			}
			return netip.MustParseAddrPort(conn.LocalAddr().String())
		}
		send("127.0.0.1", 10)
		src4 := send("127.0.0.1", 9)
		src6 := send("::1", 9)
		var got []Packet
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for len(got) < 2 {
			ps, err := c.Receive()
			if err != nil {
				t.Fatalf("receive after %d packets: %v", len(got), err)
			}
			got = append(got, ps...)
		}
		want := []Packet{
			{Prefix: "nw:test", Src: src4.Addr(), Dst: netip.MustParseAddr("127.0.0.1"), Proto: unix.IPPROTO_UDP, SrcPort: src4.Port(), DstPort: 9},
			{Prefix: "nw:test", Src: src6.Addr(), Dst: netip.MustParseAddr("::1"), Proto: unix.IPPROTO_UDP, SrcPort: src6.Port(), DstPort: 9},
		}
		if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}

		// Close returns a blocked Receive and frees the group for the next reader.
		_ = c.SetReadDeadline(time.Time{})
		done := make(chan error, 1)
		go func() { _, err := c.Receive(); done <- err }()
		time.Sleep(50 * time.Millisecond) // most likely blocked by now; either way it must return
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Receive still blocked 10 s after Close")
		}
		again, err := Open(7)
		if err != nil {
			t.Fatalf("group 7 after Close: %v", err)
		}
		again.Close()
	}, "nft", "ip")
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }
