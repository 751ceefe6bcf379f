package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// destroySets destroys unused sets as one batch. A set still referenced by the other iptables
// variant's rules (an earlier run with a different mode) cannot be destroyed; that is left for
// cleanup rather than failing every sync.
func destroySets(ctx context.Context, script []byte) error {
	if err := xtables.IPSetRestore(ctx, script); err == nil {
		return nil
	}
	var errs []error
	for _, line := range strings.Split(strings.TrimSpace(string(script)), "\n") {
		name := strings.TrimPrefix(line, "destroy ")
		out, err := exec.CommandContext(ctx, "ipset", "destroy", name).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "in use") && !strings.Contains(string(out), "does not exist") {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %s", name, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// jumpFix says how a restore handles the jumps from built-in chains into ours: existing lists
// each jump rule found (built-in chain and spec), install makes exactly one of each, first.
type jumpFix struct {
	existing [][2]string
	install  bool
	remove   bool
}

// restoreInput writes a `restore --noflush` input for Table that (re)writes the
// chains in write (declaring a chain flushes it, or creates it), deletes the chains in gone
// (flushed first, so jumps between them are gone before any is deleted), applies the rule
// edits of chains kept in place (see chainEdits), and fixes the hook jumps. Chains not named are left alone, ours and everyone else's.
func restoreInput(chains map[string][]string, write, gone, edits []string, jf jumpFix) []byte {
	return tableInput(Table, chains, write, gone, edits, jf)
}

// tableInput is restoreInput for any table: cleanup uses it for oldTable.
func tableInput(table string, chains map[string][]string, write, gone, edits []string, jf jumpFix) []byte {
	var buf bytes.Buffer
	buf.WriteString("*" + table + "\n")
	for _, n := range write {
		fmt.Fprintf(&buf, ":%s - [0:0]\n", n)
	}
	for _, n := range gone {
		fmt.Fprintf(&buf, ":%s - [0:0]\n", n)
	}
	for _, j := range jf.existing {
		if jf.install || jf.remove {
			fmt.Fprintf(&buf, "-D %s %s\n", j[0], j[1])
		}
	}
	for _, n := range write {
		for _, rule := range chains[n] {
			fmt.Fprintf(&buf, "-A %s %s\n", n, rule)
		}
	}
	for _, e := range edits {
		buf.WriteString(e + "\n")
	}
	if jf.install {
		for _, h := range hookJumps {
			fmt.Fprintf(&buf, "-I %s 1 -j %s\n", h.builtin, h.chain)
		}
	}
	for _, n := range gone {
		fmt.Fprintf(&buf, "-X %s\n", n)
	}
	buf.WriteString("COMMIT\n")
	return buf.Bytes()
}

// chainEdits turns an existing chain's rules from old into new in place: the rules between
// the common head and the common tail are deleted, replaced or inserted by position.
//
// Why not flush and rewrite the chain: with iptables-nft a flush deletes every rule of the
// chain, and the restore process then waits out an RCU grace period as it closes its netlink
// socket (the kernel frees deleted rules only after one). A pod or policy added usually only
// inserts rules, which costs no such wait, and a change touches only the rules it changes.
func chainEdits(chain string, old, new []string) []string {
	if edits, ok := subsequenceEdits(chain, old, new); ok {
		return edits
	}
	head := 0
	for head < len(old) && head < len(new) && old[head] == new[head] {
		head++
	}
	tail := 0
	for tail < len(old)-head && tail < len(new)-head && old[len(old)-1-tail] == new[len(new)-1-tail] {
		tail++
	}
	gone, added := old[head:len(old)-tail], new[head:len(new)-tail]
	var out []string
	replaced := min(len(gone), len(added))
	for i := range replaced {
		out = append(out, fmt.Sprintf("-R %s %d %s", chain, head+1+i, added[i]))
	}
	for range len(gone) - replaced {
		out = append(out, fmt.Sprintf("-D %s %d", chain, head+1+replaced))
	}
	for i := replaced; i < len(added); i++ {
		out = append(out, fmt.Sprintf("-I %s %d %s", chain, head+1+i, added[i]))
	}
	return out
}
