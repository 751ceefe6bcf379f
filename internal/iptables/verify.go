package iptables

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"

	"github.com/netwarden/netwarden/internal/guard"
)

// Drift describes how the kernel differs from what was applied.
type Drift struct{ Reason string }

func (d *Drift) Error() string { return "iptables state drifted: " + d.Reason }

// jumpFirst says what is wrong with a built-in chain's rules, whose jump to chain must come
// once, ahead of every rule of another component (the guard's jumps may precede it: they
// only drop).
func jumpFirst(rules []string, chain string) string {
	jump, found := "-j "+chain, -1
	for i, r := range rules {
		switch {
		case r == jump && found >= 0:
			return "jumps to " + chain + " twice"
		case r == jump:
			found = i
		case found < 0 && r != "-j "+guard.IPTablesChain && r != "-j "+guard.IPTablesForwardChain:
			return fmt.Sprintf("has a rule of another component ahead of the jump to %s: %s", chain, r)
		}
	}
	if found < 0 {
		return "does not jump to " + chain
	}
	return ""
}

// Verify compares the kernel with what was last applied: every chain of ours with exactly its
// rules, the hook jumps ahead of every other component's rules in their built-in chains,
// every set with exactly its members.
func (b *Backend) Verify(ctx context.Context) error {
	if b.applied == nil {
		return &Drift{Reason: "no successful sync yet"}
	}
	for fam, f := range families {
		out, err := b.run.Save(ctx, f, Table)
		if err != nil {
			return &Drift{Reason: err.Error()}
		}
		st := parseSave(out)
		if reason := compareChains(string(f), b.applied.Chains[fam], st); reason != "" {
			return &Drift{Reason: reason}
		}
	}
	out, err := exec.CommandContext(ctx, "ipset", "save").Output()
	if err != nil {
		return &Drift{Reason: "ipset save: " + err.Error()}
	}
	got := parseIPSetSave(out)
	for _, name := range slices.Sorted(maps.Keys(b.applied.Sets)) {
		s := b.applied.Sets[name]
		members, ok := got[name]
		if !ok {
			return &Drift{Reason: "set " + name + " missing"}
		}
		if s.domainSet != "" {
			continue // the learner's
		}
		if len(members) != s.Count() {
			return &Drift{Reason: fmt.Sprintf("set %s has %d members, want %d", name, len(members), s.Count())}
		}
		want := s.Elements()
		for _, m := range members {
			if !want[m] {
				return &Drift{Reason: fmt.Sprintf("set %s holds %s, which it should not", name, m)}
			}
		}
	}
	return nil
}

func compareChains(fam string, want map[string][]string, st saved) string {
	for _, name := range slices.Sorted(maps.Keys(want)) {
		got, ok := st.rules[name]
		if !ok {
			return fmt.Sprintf("%s chain %s missing", fam, name)
		}
		if !slices.Equal(got, want[name]) {
			return fmt.Sprintf("%s chain %s has %d rules that differ from the %d applied", fam, name, len(got), len(want[name]))
		}
	}
	if len(st.ownChains) != len(want) {
		return fmt.Sprintf("%s has %d chains of ours, want %d", fam, len(st.ownChains), len(want))
	}
	for _, h := range hookJumps {
		if reason := jumpFirst(st.builtin[h.builtin], h.chain); reason != "" {
			return fmt.Sprintf("%s %s %s %s", fam, Table, h.builtin, reason)
		}
	}
	return ""
}
