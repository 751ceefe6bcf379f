package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/netwarden/netwarden/internal/backendchoice"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/xtables"
)

// policyBackend opens the NetworkPolicy backend for --backend (auto, nftables or iptables),
// chosen as backendchoice says. The caller logs the choice with the backend's Name(), which
// says the iptables variant too.
func policyBackend(ctx context.Context, name string) (policy.Backend, error) {
	b, _, err := backendchoice.Open(ctx, name, func(ctx context.Context, k backendchoice.Kind) (policy.Backend, error) {
		if mode, ok := k.IPTablesMode(); ok {
			return iptables.New(ctx, mode)
		}
		return nftables.New()
	})
	if err != nil {
		return nil, fmt.Errorf("--backend %q: %w", name, err)
	}
	return b, nil
}

// renderPolicy returns the complete NetworkPolicy ruleset that --backend would apply. Render
// touches nothing, so auto renders what a host with nftables would get.
func renderPolicy(_ context.Context, name string, rs *policy.Ruleset) (string, error) {
	switch name {
	case "auto", "nftables":
		return nftables.NewWithInterface(nil).Render(rs), nil
	case "iptables":
		return iptables.Dump(iptables.Render(rs)), nil
	}
	return "", fmt.Errorf("--backend %q: want auto, nftables or iptables", name)
}

// cleanupPolicy removes the NetworkPolicy rules of every backend that may have installed them:
// the nftables table, and the chains, jumps and sets of both iptables variants. A backend that
// is unavailable on this host cannot hold anything of ours and is skipped.
func cleanupPolicy(ctx context.Context) error {
	errs := []error{cleanupGuards(ctx, nil)}
	// Rules of both iptables variants go before the sets they reference.
	ipsetUsable := false
	for _, k := range backendchoice.All {
		mode, isIPTables := k.IPTablesMode()
		if !isIPTables {
			if b, err := nftables.New(); err == nil {
				if err := b.Cleanup(ctx); err != nil {
					errs = append(errs, fmt.Errorf("nftables: %w", err))
				}
			}
			continue
		}
		r, err := xtables.NewRunner(ctx, mode)
		if err != nil {
			continue
		}
		ipsetUsable = true
		if err := iptables.CleanupRules(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
	}
	if ipsetUsable {
		if _, err := xtables.IPSetNames(ctx); err == nil {
			if err := iptables.CleanupSets(ctx); err != nil {
				errs = append(errs, fmt.Errorf("ipset: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// retireOtherPolicyBackends returns the clean-up of what backends other than chosen left in the
// kernel: when auto picks iptables after a host lost nft, or an operator changes --backend, the
// old rules must not keep judging packets beside the new ones. (The iptables backend's full sync
// already removes its rules from the other iptables variant.)
func retireOtherPolicyBackends(chosen policy.Backend) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, isNFT := chosen.(*nftables.Backend); isNFT {
			// The two variants are separate tools with separate tables: looking at both at once
			// halves what a cold start (agent --once) waits for here.
			modes := []xtables.Mode{xtables.ModeNFT, xtables.ModeLegacy}
			errs := make([]error, len(modes))
			var wg sync.WaitGroup
			for i, m := range modes {
				wg.Go(func() {
					if !xtables.AnyTablePresent(m, iptables.Table) && !xtables.AnyTablePresent(m, "filter") {
						return // nothing of this variant's here, so no rules of ours either (filter: releases before mangle)
					}
					if r, err := xtables.NewRunner(ctx, m); err == nil {
						errs[i] = iptables.CleanupRules(ctx, r)
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return err
			}
			if _, err := xtables.IPSetNames(ctx); err != nil {
				return nil // no ipset here, so no sets of ours either
			}
			return iptables.CleanupSets(ctx)
		}
		b, err := nftables.New()
		if err != nil {
			return nil // no usable nft, so no table of ours either
		}
		return b.Cleanup(ctx)
	}
}
