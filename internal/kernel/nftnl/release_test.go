package nftnl_test

import (
	"errors"
	"golang.org/x/sys/unix"
	"os"
	"strings"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

// userNetfilterSockets counts the nfnetlink sockets of processes in the calling thread's
// network namespace (the kernel's own has port ID 0).
func userNetfilterSockets(t *testing.T) int {
	t.Helper()
	out, err := os.ReadFile("/proc/thread-self/net/netlink")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n")[1:] {
		// sk Eth Pid Groups ...
		if f := strings.Fields(line); len(f) > 2 && f[1] == "12" && f[2] != "0" {
			n++
		}
	}
	return n
}

// TestReleaseFreesSockets: sockets handed to the kernel's collector after a deleting commit
// are freed by it (none is leaked), and a released Conn can be used again.
func TestReleaseFreesSockets(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		before := userNetfilterSockets(t)
		table := &gnft.Table{Name: "release-test", Family: gnft.TableFamilyINet}
		chain := &gnft.Chain{Name: "c", Table: table}
		var c nftnl.Conn
		t.Cleanup(c.Release) // a failed round must not keep the namespace alive through its sockets
		for round := range 3 {
			if err := c.Batch(func(conn *gnft.Conn) error {
				conn.AddTable(table)
				conn.AddChain(chain)
				for range 20 {
					conn.AddRule(&gnft.Rule{Table: table, Chain: chain, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
				}
				return nil
			}); err != nil {
				t.Fatalf("round %d: add: %v", round, err)
			}
			// A deleting commit leaves the kernel a deferred free, which a close would wait for.
			if err := c.Batch(func(conn *gnft.Conn) error { conn.DelTable(table); return nil }); err != nil {
				t.Fatalf("round %d: delete: %v", round, err)
			}
			raw, err := nftnl.DialRaw()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(raw.Release) // a no-op once released
			// conntrack IPCTNL_MSG_CT_GET, AF_UNSPEC
			if _, err := raw.Dump(0x0101, make([]byte, 4)); err != nil {
				t.Fatalf("round %d: conntrack dump: %v", round, err)
			}
			// Earlier rounds' sockets may still be waiting for the collector.
			if got := userNetfilterSockets(t); got < before+2 {
				t.Fatalf("round %d: %d nfnetlink sockets open, want at least %d", round, got, before+2)
			}
			c.Release()
			raw.Release()
		}
		deadline := time.Now().Add(10 * time.Second)
		for userNetfilterSockets(t) != before {
			if time.Now().After(deadline) {
				t.Fatalf("released sockets were never freed: %d nfnetlink sockets left, want %d", userNetfilterSockets(t), before)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestKernelErrorsKeepTheirErrno: the kernel's refusals reach the caller as their errno, both
// of a query (a chain that does not exist) and of a batch (a rule in a chain that does not
// exist), even though the socket asks for capped acknowledgements.
func TestKernelErrorsKeepTheirErrno(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		var c nftnl.Conn
		t.Cleanup(c.Release)
		table := &gnft.Table{Name: "errno-test", Family: gnft.TableFamilyINet}
		conn, err := c.Get()
		if err != nil {
			t.Fatal(err)
		}
		// google/nftables words the errno into its error rather than wrapping it.
		isENOENT := func(err error) bool {
			return err != nil && (errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), unix.ENOENT.Error()))
		}
		if _, err := conn.ListChain(table, "missing"); !isENOENT(err) {
			t.Fatalf("listing a missing chain: %v, want ENOENT", err)
		}
		err = c.Batch(func(conn *gnft.Conn) error {
			conn.AddTable(table)
			conn.AddRule(&gnft.Rule{Table: table, Chain: &gnft.Chain{Name: "missing", Table: table},
				Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
			return nil
		})
		if !isENOENT(err) {
			t.Fatalf("a batch adding a rule to a missing chain: %v, want ENOENT", err)
		}
		// The failed batch committed nothing, and the Conn works on.
		if err := c.Batch(func(conn *gnft.Conn) error { conn.AddTable(table); return nil }); err != nil {
			t.Fatalf("a batch after the failed one: %v", err)
		}
	})
}
