package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"sort"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/xtables"
)

var families = [2]xtables.Family{xtables.IPv4, xtables.IPv6}

// Backend owns the NETWARDEN-* chains of the filter table and the netwarden-* ipsets.
type Backend struct {
	run      *xtables.Runner
	renderer Renderer
	// applied is what the kernel held after our last successful sync; nil forces the next
	// sync to replace everything. When removals were deferred (see withDeferredRemovals) it
	// holds them, and target is the rendering they lead to.
	applied *Rendered
	target  *Rendered
}

// New returns a backend for one iptables variant after checking that its commands and ipset
// work in this network namespace.
func New(ctx context.Context, mode xtables.Mode) (*Backend, error) {
	r, err := xtables.NewRunner(ctx, mode)
	if err != nil {
		return nil, err
	}
	if _, err := xtables.IPSetNames(ctx); err != nil {
		return nil, fmt.Errorf("ipset: %w", err)
	}
	return &Backend{run: r}, nil
}

// Name implements dataplane.PolicyBackend: iptables-nft or iptables-legacy.
func (b *Backend) Name() string { return "iptables-" + string(b.run.Mode) }

// Mode is the iptables variant in use.
func (b *Backend) Mode() xtables.Mode { return b.run.Mode }

// Render implements dataplane.PolicyBackend: the ipset script and both restore inputs a sync
// into an empty node would apply.
func (b *Backend) Render(rs *policy.Ruleset) string { return Dump(Render(rs)) }

// Dump prints r as the commands that load it into an empty node.
func Dump(r *Rendered) string {
	if r.err != nil {
		return "# render error: " + r.err.Error() + "\n"
	}
	var sb strings.Builder
	for _, sk := range r.Skipped {
		fmt.Fprintf(&sb, "# skipped %s, fail-closed (its pods stay isolated, it admits nothing): %s\n", sk.Policy, sk.Reason)
	}
	sb.WriteString("# kernel names and the Ruleset objects they stand for\n")
	for _, k := range slices.Sorted(maps.Keys(r.Sources)) {
		fmt.Fprintf(&sb, "#   %s = %s\n", k, r.Sources[k])
		if pols, ok := r.GroupPolicies[k]; ok {
			fmt.Fprintf(&sb, "#     holding the rules of %s\n", strings.Join(pols, ", "))
		}
	}
	sb.WriteString("# ipset restore\n")
	for _, name := range slices.Sorted(maps.Keys(r.Sets)) {
		s := r.Sets[name]
		sb.WriteString(s.createLine(name) + "\n")
		for _, m := range slices.Sorted(maps.Keys(s.elements())) {
			fmt.Fprintf(&sb, "add %s %s\n", name, m)
		}
	}
	for fam, f := range families {
		fmt.Fprintf(&sb, "# %s-restore --noflush\n", f)
		sb.Write(restoreInput(r.Chains[fam], slices.Sorted(maps.Keys(r.Chains[fam])), nil, nil, jumpFix{}))
	}
	return sb.String()
}

// SetDropLog implements dataplane.DropLogger. The next sync renders every chain anew.
func (b *Backend) SetDropLog(l *dataplane.DropLog) { b.renderer = Renderer{log: l} }

// Sync implements dataplane.PolicyBackend.
func (b *Backend) Sync(ctx context.Context, rs *policy.Ruleset) (dataplane.SyncResult, error) {
	want := b.renderer.Render(rs)
	res, err := b.SyncRendered(ctx, want)
	res.Skipped = want.Skipped
	return res, err
}

// FullSync implements dataplane.PolicyBackend.
func (b *Backend) FullSync(ctx context.Context, rs *policy.Ruleset) (dataplane.SyncResult, error) {
	want := b.renderer.Render(rs)
	res, err := b.FullSyncRendered(ctx, want)
	res.Skipped = want.Skipped
	return res, err
}

// SyncRendered makes the kernel hold want, sending only the difference from the last
// successful sync: new and grown sets first, then one restore per family that changed, then
// shrunk and unused sets. A failed difference falls back to a full sync.
func (b *Backend) SyncRendered(ctx context.Context, want *Rendered) (dataplane.SyncResult, error) {
	if want.err != nil {
		return dataplane.SyncResult{}, want.err
	}
	if b.CompactionPending() && diff(b.target, want).empty() {
		// Nothing changed since the change that deferred removals: they keep waiting for
		// the compaction instead of being paid by this sync.
		b.target = want
		return dataplane.SyncResult{Size: want.size()}, nil
	}
	return b.sync(ctx, want)
}

func (b *Backend) sync(ctx context.Context, want *Rendered) (dataplane.SyncResult, error) {
	if b.applied == nil {
		return b.FullSyncRendered(ctx, want)
	}
	p, kernel := diff(b.applied, want), want
	if p.empty() {
		b.applied, b.target = want, want // the same content
		return dataplane.SyncResult{Size: want.size()}, nil
	}
	if b.applied == b.target && b.run.Mode == xtables.ModeNFT && p.removes() {
		// Only iptables-nft pays for removals (see withDeferredRemovals); a rendering that
		// holds deferred removals already is brought to want directly, which compacts it.
		k := withDeferredRemovals(b.applied, want)
		if dp := diff(b.applied, k); !dp.removes() {
			p, kernel = dp, k
		}
	}
	err := b.applyPlan(ctx, p, kernel)
	if err == nil {
		b.applied, b.target = kernel, want
		return dataplane.SyncResult{Operations: p.operations(), Size: want.size()}, nil
	}
	res, ferr := b.FullSyncRendered(ctx, want)
	res.Fallback = err.Error()
	return res, ferr
}

// CompactionPending reports whether the kernel holds removals that a change deferred.
func (b *Backend) CompactionPending() bool { return b.applied != nil && b.applied != b.target }

// Compact applies the removals that changes deferred: the rules, chains and sets that no
// packet reaches any more. The agent calls it when no change has come for a while.
func (b *Backend) Compact(ctx context.Context) (dataplane.SyncResult, error) {
	if !b.CompactionPending() {
		return dataplane.SyncResult{}, nil
	}
	return b.sync(ctx, b.target)
}

func (b *Backend) applyPlan(ctx context.Context, p *plan, want *Rendered) error {
	if len(p.setsBefore) > 0 {
		if err := xtables.IPSetRestore(ctx, p.setsBefore); err != nil {
			return err
		}
	}
	for fam, f := range families {
		c := p.chains[fam]
		if len(c.write)+len(c.gone)+len(c.edits) == 0 {
			continue
		}
		if err := b.run.Restore(ctx, f, restoreInput(want.Chains[fam], c.write, c.gone, c.edits, jumpFix{})); err != nil {
			return err
		}
	}
	if len(p.setsAfter) > 0 {
		if err := xtables.IPSetRestore(ctx, p.setsAfter); err != nil {
			return err
		}
	}
	return nil
}

// FullSyncRendered replaces everything we own with want, whatever the kernel held: every set
// is created or refilled through a swap, each family's chains are rewritten in one restore,
// the hook jumps are made to be the first rule of their built-in chains, and chains and sets
// an earlier run left are removed, in the other iptables variant too. Other components' rules
// are never touched.
func (b *Backend) FullSyncRendered(ctx context.Context, want *Rendered) (dataplane.SyncResult, error) {
	res := dataplane.SyncResult{Full: true}
	if want.err != nil {
		return res, want.err
	}
	b.applied = nil
	existing, err := xtables.IPSetNames(ctx)
	if err != nil {
		return res, fmt.Errorf("listing ipsets: %w", err)
	}
	have := map[string]bool{}
	for _, n := range existing {
		have[n] = true
	}
	var pre bytes.Buffer
	if have[swapSet] {
		fmt.Fprintf(&pre, "destroy %s\n", swapSet) // left by a run that died mid-sync
	}
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		s := want.Sets[name]
		target := name
		if have[name] {
			target = swapSet
		}
		pre.WriteString(s.createLine(target) + "\n")
		for _, m := range slices.Sorted(maps.Keys(s.elements())) {
			fmt.Fprintf(&pre, "add %s %s\n", target, m)
		}
		if have[name] {
			fmt.Fprintf(&pre, "swap %s %s\ndestroy %s\n", swapSet, name, swapSet)
		}
		res.Operations += 1 + s.count
	}
	if err := xtables.IPSetRestore(ctx, pre.Bytes()); err != nil {
		return res, fmt.Errorf("iptables full sync: %w", err)
	}
	for fam, f := range families {
		saved, err := b.run.Save(ctx, f, "filter")
		if err != nil {
			return res, fmt.Errorf("iptables full sync: %w", err)
		}
		st := parseSave(saved)
		var stale []string
		for _, c := range st.ownChains {
			if _, ok := want.Chains[fam][c]; !ok {
				stale = append(stale, c)
			}
		}
		names := slices.Sorted(maps.Keys(want.Chains[fam]))
		in := restoreInput(want.Chains[fam], names, stale, nil, jumpFix{existing: st.jumps, install: true})
		if err := b.run.Restore(ctx, f, in); err != nil {
			return res, fmt.Errorf("iptables full sync: %w", err)
		}
		for _, n := range names {
			res.Operations += 1 + len(want.Chains[fam][n])
		}
	}
	// A run with the other variant (say, before iptables-nft was installed) left chains there
	// that would still judge packets; they go before the sets they use.
	if err := b.cleanupOtherVariant(ctx); err != nil {
		return res, fmt.Errorf("iptables full sync: %w", err)
	}
	var post bytes.Buffer
	for _, n := range existing {
		if strings.HasPrefix(n, SetPrefix) && n != swapSet && want.Sets[n] == nil {
			fmt.Fprintf(&post, "destroy %s\n", n)
			res.Operations++
		}
	}
	if post.Len() > 0 {
		if err := destroySets(ctx, post.Bytes()); err != nil {
			return res, fmt.Errorf("iptables full sync: %w", err)
		}
	}
	b.applied, b.target = want, want
	res.Size = want.size()
	return res, nil
}

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

// restoreInput writes a `restore --noflush` input for the filter table that (re)writes the
// chains in write (declaring a chain flushes it, or creates it), deletes the chains in gone
// (flushed first, so jumps between them are gone before any is deleted), applies the rule
// edits of chains kept in place (see chainEdits), and fixes the hook jumps. Chains not named are left alone, ours and everyone else's.
func restoreInput(chains map[string][]string, write, gone, edits []string, jf jumpFix) []byte {
	var buf bytes.Buffer
	buf.WriteString("*filter\n")
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

// saved is what a filter table listing says about our objects.
type saved struct {
	ownChains []string
	rules     map[string][]string // our chains' rule specs, in order
	jumps     [][2]string         // rules in built-in chains that jump to ours
	builtin   map[string][]string // specs of the built-in chains' rules
}

func parseSave(out []byte) saved {
	st := saved{rules: map[string][]string{}, builtin: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if strings.HasPrefix(name, ChainPrefix) {
				st.ownChains = append(st.ownChains, name)
				st.rules[name] = nil
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			if strings.HasPrefix(chain, ChainPrefix) {
				st.rules[chain] = append(st.rules[chain], spec)
				continue
			}
			st.builtin[chain] = append(st.builtin[chain], spec)
			if strings.Contains(spec, "-j "+ChainPrefix) || strings.Contains(spec, "-g "+ChainPrefix) {
				st.jumps = append(st.jumps, [2]string{chain, spec})
			}
		}
	}
	return st
}

// plan is the difference between two renderings.
type plan struct {
	setsBefore []byte // creates and additions, before any rule uses them
	setsAfter  []byte // deletions and destroys, once no rule needs them
	// Per family: chains created or rewritten whole, chains removed, and rule edits
	// (-I, -R, -D lines) of chains that exist on both sides.
	chains [2]struct{ write, gone, edits []string }
	ops    int
}

func (p *plan) empty() bool { return p.ops == 0 }

// removes reports whether the plan deletes a rule, chain or set: with iptables-nft, a restore
// that does waits out an RCU grace period as it exits. Set members leaving a set do not count:
// ipset deletes them without that wait.
func (p *plan) removes() bool {
	for _, c := range p.chains {
		if len(c.gone) > 0 {
			return true
		}
		for _, e := range c.edits {
			if !strings.HasPrefix(e, "-I ") {
				return true
			}
		}
	}
	return bytes.Contains(p.setsAfter, []byte("destroy "))
}

func (p *plan) operations() int { return p.ops }

// diff computes the plan that turns old into new. Members join a set before the rules that
// need them and leave it after, so a pod moving between groups is judged by the old group or
// the new one at every instant, never by none.
func diff(old, new *Rendered) *plan {
	p := &plan{}
	var before, after bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(new.Sets)) {
		s, o := new.Sets[name], old.Sets[name]
		if s == o {
			continue
		}
		if o == nil || o.typ != s.typ || o.v6 != s.v6 {
			if o != nil {
				// Same name, different kind: cannot happen with hashed names of one kind.
				fmt.Fprintf(&after, "destroy %s\n", name)
			}
			before.WriteString(s.createLine(name) + "\n")
			p.ops++
			for _, m := range slices.Sorted(maps.Keys(s.elements())) {
				fmt.Fprintf(&before, "add %s %s\n", name, m)
				p.ops++
			}
			continue
		}
		var added, removed []string
		if s.base != nil && s.base == o.src {
			added, removed = s.added, s.removed
		} else {
			ne, oe := s.elements(), o.elements()
			for m := range ne {
				if !oe[m] {
					added = append(added, m)
				}
			}
			for m := range oe {
				if !ne[m] {
					removed = append(removed, m)
				}
			}
			sort.Strings(added)
			sort.Strings(removed)
		}
		for _, m := range added {
			fmt.Fprintf(&before, "add %s %s -exist\n", name, m)
		}
		for _, m := range removed {
			fmt.Fprintf(&after, "del %s %s -exist\n", name, m)
		}
		p.ops += len(added) + len(removed)
	}
	for fam := range new.Chains {
		for _, name := range slices.Sorted(maps.Keys(new.Chains[fam])) {
			o, ok := old.Chains[fam][name]
			n := new.Chains[fam][name]
			if ok && slices.Equal(o, n) {
				continue
			}
			if ok {
				edits := chainEdits(name, o, n)
				p.chains[fam].edits = append(p.chains[fam].edits, edits...)
				p.ops += len(edits)
				continue
			}
			p.chains[fam].write = append(p.chains[fam].write, name)
			p.ops += 1 + len(n)
		}
		for _, name := range slices.Sorted(maps.Keys(old.Chains[fam])) {
			if _, ok := new.Chains[fam][name]; !ok {
				p.chains[fam].gone = append(p.chains[fam].gone, name)
				p.ops += 2
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(old.Sets)) {
		if new.Sets[name] == nil {
			fmt.Fprintf(&after, "destroy %s\n", name)
			p.ops++
		}
	}
	p.setsBefore, p.setsAfter = before.Bytes(), after.Bytes()
	return p
}

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

// parseIPSetSave returns the members of each set in `ipset save` output.
func parseIPSetSave(out []byte) map[string][]string {
	sets := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "create":
			if _, ok := sets[f[1]]; !ok {
				sets[f[1]] = []string{}
			}
		case len(f) >= 3 && f[0] == "add":
			sets[f[1]] = append(sets[f[1]], f[2])
		}
	}
	return sets
}

// Cleanup removes our chains and the hook jumps, of both variants where the other one works,
// and then our sets.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.applied, b.target = nil, nil
	if err := CleanupRules(ctx, b.run); err != nil {
		return err
	}
	if err := b.cleanupOtherVariant(ctx); err != nil {
		return err
	}
	return CleanupSets(ctx)
}

// cleanupOtherVariant removes our rules from the iptables variant this backend does not use,
// when that variant works here.
func (b *Backend) cleanupOtherVariant(ctx context.Context) error {
	other := xtables.ModeLegacy
	if b.run.Mode == xtables.ModeLegacy {
		other = xtables.ModeNFT
	}
	r, err := xtables.NewRunner(ctx, other)
	if err != nil {
		return nil // not usable here, so it holds nothing of ours
	}
	if err := CleanupRules(ctx, r); err != nil {
		return fmt.Errorf("removing our iptables-%s rules: %w", other, err)
	}
	return nil
}

// CleanupRules removes the hook jumps and every NETWARDEN-* chain of one variant, both
// families. It is a no-op when there is nothing of ours.
func CleanupRules(ctx context.Context, r *xtables.Runner) error {
	for _, f := range families {
		out, err := r.Save(ctx, f, "filter")
		if err != nil {
			return err
		}
		st := parseSave(out)
		if len(st.ownChains) == 0 && len(st.jumps) == 0 {
			continue
		}
		if err := r.Restore(ctx, f, restoreInput(nil, nil, st.ownChains, nil, jumpFix{existing: st.jumps, remove: true})); err != nil {
			return err
		}
	}
	return nil
}

// CleanupSets destroys every netwarden-* ipset. Run it after CleanupRules for every variant
// that may reference them.
func CleanupSets(ctx context.Context) error {
	names, err := xtables.IPSetNames(ctx)
	if err != nil {
		return err
	}
	var script bytes.Buffer
	for _, n := range names {
		if strings.HasPrefix(n, SetPrefix) {
			fmt.Fprintf(&script, "destroy %s\n", n)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	return xtables.IPSetRestore(ctx, script.Bytes())
}
