package nftnl_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

// TestBatchReportsWhatFails: batches are sent without acknowledgements asked for, so a failed
// message must still fail its batch, with the kernel's error, and leave nothing applied; a
// good batch after it applies; and comments reach the table and chain they are given for.
func TestBatchReportsWhatFails(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		var c nftnl.Conn
		defer c.Release()
		table := &gnft.Table{Name: "t", Family: gnft.TableFamilyINet}
		err := c.Batch(func(conn *gnft.Conn) error {
			conn.AddTable(table)
			conn.AddChain(&gnft.Chain{Name: "a", Table: table})
			// The third of four messages fails: the chain it flushes does not exist.
			conn.FlushChain(&gnft.Chain{Name: "missing", Table: table})
			conn.AddChain(&gnft.Chain{Name: "b", Table: table})
			return nil
		})
		if !errors.Is(err, unix.ENOENT) {
			t.Fatalf("batch with a failing message: %v, want ENOENT", err)
		}
		if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err != nil || strings.Contains(string(out), "table inet t") {
			t.Fatalf("after the failed batch the kernel lists %q (%v); want no table t", out, err)
		}
		comments := nftnl.Comments{Tables: map[string]string{"t": "the table"}, Chains: map[[2]string]string{{"t", "b"}: "chain b"}}
		if err := c.BatchWithComments(comments, func(conn *gnft.Conn) error {
			conn.AddTable(table)
			conn.AddChain(&gnft.Chain{Name: "a", Table: table})
			conn.AddChain(&gnft.Chain{Name: "b", Table: table})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("nft", "list", "table", "inet", "t").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, want := range []string{`comment "the table"`, "chain a {\n\t}", "chain b {\n\t\tcomment \"chain b\""} {
			if !strings.Contains(string(out), want) {
				t.Fatalf("listing lacks %q:\n%s", want, out)
			}
		}
	})
}
