package iptables

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
)

// Drift describes how the kernel differs from what was applied.
type Drift struct{ Reason string }

func (d *Drift) Error() string { return "iptables state drifted: " + d.Reason }

// Verify compares the kernel with what was last applied: every chain of ours with exactly its
// rules, the hook jumps first in their built-in chains, every set with exactly its members.
func (b *Backend) Verify(ctx context.Context) error {
	if b.applied == nil {
		return &Drift{Reason: "no successful sync yet"}
	}
	for fam, f := range families {
		out, err := b.run.Save(ctx, f, "filter")
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
		if len(members) != s.count {
			return &Drift{Reason: fmt.Sprintf("set %s has %d members, want %d", name, len(members), s.count)}
		}
		want := s.elements()
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
		rules := st.builtin[h.builtin]
		if len(rules) == 0 || rules[0] != "-j "+h.chain {
			return fmt.Sprintf("%s %s does not jump to %s first", fam, h.builtin, h.chain)
		}
	}
	return ""
}
