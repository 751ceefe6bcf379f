package iptables

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/netwarden/netwarden/internal/xtables"
)

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
		if !xtables.TablePresent(r.Mode, f, "filter") {
			continue // no table, no rules of ours: no save to run
		}
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
