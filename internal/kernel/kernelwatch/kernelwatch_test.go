package kernelwatch

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

// TestReportsOthersCommitsToWatchedTables: commits of nft and iptables-nft to watched tables
// are reported with the committing process; commits to other tables, and those Ours claims,
// are not.
func TestReportsOthersCommitsToWatchedTables(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		var ours atomic.Value // the command name Ours claims
		ours.Store("")
		w, err := Open(Config{
			Tables: []Table{{"inet", "watched"}, {"ip", "mangle"}},
			Ours:   func(pid int, comm string, _ uint32) bool { return comm == ours.Load().(string) },
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		changes := make(chan Change, 100)
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx, func(c Change) { changes <- c }) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		run := func(name string, args ...string) {
			t.Helper()
			if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
				t.Fatalf("%s %v: %v %s", name, args, err, out)
			}
		}
		markers := 0
		expect := func(step string, want []Table, process string) {
			t.Helper()
			// The command's own commit was notified before it exited; a marker commit after
			// it to a watched table, claimed by nobody, proves that nothing else came first.
			markers++
			run("nft", "add", "table", "inet", "watched")
			run("nft", "add", "chain", "inet", "watched", fmt.Sprintf("marker%d", markers))
			deadline := time.After(5 * time.Second)
			for first := true; ; first = false {
				select {
				case c := <-changes:
					if first && want != nil {
						byName := func(a, b Table) int { return strings.Compare(a.String(), b.String()) }
						slices.SortFunc(c.Tables, byName)
						slices.SortFunc(want, byName)
						if !slices.Equal(c.Tables, want) || c.Process != process || c.PID == 0 {
							t.Fatalf("%s: got %+v, want a change of %s by %s", step, c, want, process)
						}
						continue
					}
					if c.Process != "nft" || len(c.Tables) != 1 || c.Tables[0] != (Table{"inet", "watched"}) {
						t.Fatalf("%s: unexpected change %+v", step, c)
					}
					return
				case <-deadline:
					t.Fatalf("%s: no notification", step)
				}
			}
		}
		run("nft", "add", "table", "inet", "watched")
		expect("table added", []Table{{"inet", "watched"}}, "nft")
		run("nft", "add", "table", "inet", "unwatched")
		expect("another table", nil, "")
		run("iptables-nft", "-t", "mangle", "-A", "FORWARD", "-j", "ACCEPT")
		expect("iptables-nft rule", []Table{{"ip", "mangle"}}, "iptables-nft")
		ours.Store("iptables-nft")
		run("iptables-nft", "-t", "mangle", "-F", "FORWARD")
		expect("a commit Ours claims", nil, "")
		ours.Store("")
		run("nft", "flush", "ruleset")
		expect("flush ruleset", []Table{{"inet", "watched"}, {"ip", "mangle"}}, "nft")
	}, "nft", "iptables-nft")
}

// TestLegacyShapeChanges: every kind of edit another process makes to a legacy table changes
// its shape; reading it changes nothing.
func TestLegacyShapeChanges(t *testing.T) {
	kerneltest.InFreshNetNS(t, func() {
		run := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("iptables-legacy", args...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v %s", args, err, out)
			}
		}
		run("-t", "mangle", "-N", "OURS")
		run("-t", "mangle", "-A", "FORWARD", "-j", "OURS")
		last, err := LegacyTable(false, "mangle")
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := LegacyTable(false, "mangle"); again != last {
			t.Fatalf("reading changed the shape: %+v, then %+v", last, again)
		}
		for _, edit := range [][]string{
			{"-t", "mangle", "-I", "FORWARD", "1", "-j", "ACCEPT"},
			{"-t", "mangle", "-F", "FORWARD"},
			{"-t", "mangle", "-A", "INPUT", "-j", "OURS"},
			{"-t", "mangle", "-A", "OURS", "-j", "RETURN"},
			{"-t", "mangle", "-F"},
		} {
			run(edit...)
			cur, err := LegacyTable(false, "mangle")
			if err != nil {
				t.Fatal(err)
			}
			if cur == last {
				t.Errorf("%v left the shape as it was: %+v", edit, cur)
			}
			last = cur
		}
	}, "iptables-legacy")
}
