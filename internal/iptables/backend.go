package iptables

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
)

// The capabilities the agent finds by type assertion.
var (
	_ policy.Backend         = (*Backend)(nil)
	_ policy.DropLogger      = (*Backend)(nil)
	_ policy.StagedReporter  = (*Backend)(nil)
	_ dataplane.Compactor    = (*Backend)(nil)
	_ dataplane.KernelTables = (*Backend)(nil)
)

var families = [2]xtables.Family{xtables.IPv4, xtables.IPv6}

// Backend owns the NETWARDEN-* chains of the filter table and the netwarden-* ipsets.
type Backend struct {
	run      *xtables.Runner
	renderer Renderer
	// learned holds what the DomainSets' learner needs (see learned.go).
	learned learnedSets
	// applied is what the kernel held after our last successful sync; nil forces the next
	// sync to replace everything. When removals were deferred (see withDeferredRemovals) it
	// holds them, and target is the rendering they lead to.
	applied *Rendered
	target  *Rendered
	// staged is when each outcome chain of staged policies was written (see staged.go).
	staged stagedRecord
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

// Name implements policy.Backend: iptables-nft or iptables-legacy.
func (b *Backend) Name() string { return "iptables-" + string(b.run.Mode) }

// Mode is the iptables variant in use.
func (b *Backend) Mode() xtables.Mode { return b.run.Mode }

// Render implements policy.Backend: the ipset script and both restore inputs a sync
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
		for _, m := range s.Keys() {
			fmt.Fprintf(&sb, "add %s %s\n", name, m)
		}
	}
	for fam, f := range families {
		fmt.Fprintf(&sb, "# %s-restore --noflush\n", f)
		sb.Write(restoreInput(r.Chains[fam], slices.Sorted(maps.Keys(r.Chains[fam])), nil, nil, jumpFix{}))
	}
	return sb.String()
}

// SetDropLog implements policy.DropLogger. The next sync renders every chain anew.
func (b *Backend) SetDropLog(l *policy.DropLog) {
	b.renderer = b.renderer.anew(func(r *Renderer) { r.log = l })
}

// Sync implements policy.Backend.
func (b *Backend) Sync(ctx context.Context, rs *policy.Ruleset) (dataplane.SyncResult, error) {
	want := b.renderer.Render(rs)
	res, err := b.SyncRendered(ctx, want)
	res.Skipped = want.Skipped
	return res, err
}

// FullSync implements policy.Backend.
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
	release := b.lockIfLearning(b.applied, kernel)
	err := b.applyPlan(ctx, p, b.applied, kernel)
	release(err == nil)
	if err == nil {
		b.staged.begin()
		for fam, c := range p.chains {
			b.staged.written(fam, append(slices.Clip(c.write), editedChains(c.edits)...), false)
			b.staged.gone(fam, c.gone)
		}
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

func (b *Backend) applyPlan(ctx context.Context, p *plan, old, want *Rendered) error {
	before := p.setsBefore
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		if s := want.Sets[name]; s.domainSet != "" && old.Sets[name] == nil {
			buf := bytes.NewBuffer(slices.Clone(before))
			b.learnedAdds(buf, name, s)
			before = buf.Bytes()
		}
	}
	if len(before) > 0 {
		if err := xtables.IPSetRestore(ctx, before); err != nil {
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
// an earlier run left are removed, in the filter table (releases before the move to mangle)
// and in the other iptables variant too. Other components' rules
// are never touched.
func (b *Backend) FullSyncRendered(ctx context.Context, want *Rendered) (res dataplane.SyncResult, err error) {
	res = dataplane.SyncResult{Full: true}
	if want.err != nil {
		return res, want.err
	}
	release := b.lockIfLearning(nil, want)
	defer func() { release(err == nil) }()
	b.applied = nil
	b.staged.begin()
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
		if s.domainSet != "" {
			// What the learner wrote stays: an existing set keeps its members.
			if !have[name] {
				pre.WriteString(s.createLine(name) + "\n")
				res.Operations++
			}
			b.learnedAdds(&pre, name, s)
			continue
		}
		target := name
		if have[name] {
			target = swapSet
		}
		pre.WriteString(s.createLine(target) + "\n")
		for _, m := range s.Keys() {
			fmt.Fprintf(&pre, "add %s %s\n", target, m)
		}
		if have[name] {
			fmt.Fprintf(&pre, "swap %s %s\ndestroy %s\n", swapSet, name, swapSet)
		}
		res.Operations += 1 + s.Count()
	}
	if err := xtables.IPSetRestore(ctx, pre.Bytes()); err != nil {
		return res, fmt.Errorf("iptables full sync: %w", err)
	}
	for fam, f := range families {
		saved, err := b.run.Save(ctx, f, Table)
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
		b.staged.written(fam, names, true)
		for _, n := range names {
			res.Operations += 1 + len(want.Chains[fam][n])
		}
		// Only once the new chains judge packets: what a release before the move to mangle
		// left in the filter table.
		if err := cleanupTable(ctx, b.run, f, oldTable); err != nil {
			return res, fmt.Errorf("iptables full sync: %w", err)
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

// KernelTables implements dataplane.KernelTables.
func (b *Backend) KernelTables() []dataplane.KernelTable {
	legacy := b.run.Mode == xtables.ModeLegacy
	return []dataplane.KernelTable{{Family: "ip", Name: Table, Legacy: legacy}, {Family: "ip6", Name: Table, Legacy: legacy}}
}
