package iptables

import (
	"context"
	"fmt"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// Cleanup removes our chains and the hook jumps, of both variants where the other one works,
// and then our sets.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.applied, b.target = nil, nil
	b.staged.reset()
	if err := CleanupRules(ctx, b.run); err != nil {
		return err
	}
	if err := b.cleanupOtherVariant(ctx); err != nil {
		return err
	}
	return CleanupSets(ctx)
}

// cleanupOtherVariant removes our rules from the iptables variant this backend does not use,
// when that variant works here. A full sync needs it before it destroys the sets it no longer
// uses, which the other variant's rules may still reference (ipsets are shared by both).
func (b *Backend) cleanupOtherVariant(ctx context.Context) error {
	other := xtables.ModeLegacy
	if b.run.Mode == xtables.ModeLegacy {
		other = xtables.ModeNFT
	}
	if err := CleanupLeftovers(ctx, other); err != nil {
		return fmt.Errorf("removing our iptables-%s rules: %w", other, err)
	}
	return nil
}

// CleanupRules removes the hook jumps and every NETWARDEN-* chain of one variant, both
// families, from Table and from where earlier releases kept them. It is a no-op when there is
// nothing of ours. The guard's chains are the guard's to remove.
func CleanupRules(ctx context.Context, r *xtables.Runner) error {
	for _, f := range families {
		for _, table := range []string{Table, oldTable} {
			if err := cleanupTable(ctx, r, f, table); err != nil {
				return err
			}
		}
	}
	return nil
}

// cleanupTable removes our chains and the jumps to them from one table of one family.
func cleanupTable(ctx context.Context, r *xtables.Runner, f xtables.Family, table string) error {
	if !xtables.TablePresent(r.Mode, f, table) {
		return nil // no table, no rules of ours: no save to run
	}
	out, err := r.Save(ctx, f, table)
	if err != nil {
		return err
	}
	st := parseSave(out)
	if len(st.ownChains) == 0 && len(st.jumps) == 0 {
		return nil
	}
	return r.Restore(ctx, f, tableInput(table, nil, nil, st.ownChains, nil, jumpFix{existing: st.jumps, remove: true}))
}

// CleanupSets destroys every netwarden-* ipset. Run it after CleanupRules for every variant
// that may reference them.
func CleanupSets(ctx context.Context) error { return xtables.DestroyIPSets(ctx, SetPrefix) }

// CleanupLeftovers removes the rules (not the ipsets, which both variants share: see
// CleanupSets) that a backend of variant mode left; nothing when that variant holds no table
// we use or does not work here.
func CleanupLeftovers(ctx context.Context, mode xtables.Mode) error {
	if !xtables.AnyTablePresent(mode, Table) && !xtables.AnyTablePresent(mode, oldTable) {
		return nil // nothing of this variant's here, so no rules of ours either
	}
	r, err := xtables.NewRunner(ctx, mode)
	if err != nil {
		return nil
	}
	return CleanupRules(ctx, r)
}
