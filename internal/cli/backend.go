package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/netwarden/netwarden/internal/backendchoice"
	"github.com/netwarden/netwarden/internal/domains"
	"github.com/netwarden/netwarden/internal/guard"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/masquerade"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
)

// A feature's rules in the kernel, as one kind of backend keeps them.
type feature int

const (
	networkPolicyRules feature = iota
	guardRules
	masqueradeRules
)

// kindBackends is what each feature's backend of one kind the chooser picks does to be opened
// and to remove what it left in the kernel. Every feature is cleaned up, and every backend
// other than the chosen one retired, through this one table.
type kindBackends struct {
	policy     func(context.Context) (policy.Backend, error)
	masquerade func(context.Context) (masquerade.Backend, error)
	guard      func() guard.Guard
	// leftovers removes the rules a feature's backend of this kind left (but not the ipsets
	// the iptables kinds share: see ipsetPrefix); nothing where this kind does not work, since
	// then nothing of ours can be there either.
	leftovers [3]func(context.Context) error
}

var kinds = map[backendchoice.Kind]kindBackends{
	backendchoice.NFTables: {
		policy:     func(context.Context) (policy.Backend, error) { return nftables.New() },
		masquerade: func(context.Context) (masquerade.Backend, error) { return masquerade.NewNFTables() },
		// Probed at its first use: the backend's own probe has shown that nft works.
		guard:     func() guard.Guard { return guard.NewNFTables() },
		leftovers: [3]func(context.Context) error{nftables.CleanupLeftovers, guard.CleanupNFTables, masquerade.CleanupNFTables},
	},
	backendchoice.IPTablesNFT:    iptablesKind(xtables.ModeNFT),
	backendchoice.IPTablesLegacy: iptablesKind(xtables.ModeLegacy),
}

func iptablesKind(mode xtables.Mode) kindBackends {
	return kindBackends{
		policy: func(ctx context.Context) (policy.Backend, error) { return iptables.New(ctx, mode) },
		masquerade: func(ctx context.Context) (masquerade.Backend, error) {
			r, err := xtables.NewRunner(ctx, mode)
			if err != nil {
				return nil, err
			}
			return masquerade.NewIPTables(r), nil
		},
		guard: func() guard.Guard { return guard.NewIPTables(&xtables.Runner{Mode: mode}) },
		leftovers: [3]func(context.Context) error{
			func(ctx context.Context) error { return iptables.CleanupLeftovers(ctx, mode) },
			func(ctx context.Context) error { return guard.CleanupIPTables(ctx, mode) },
			func(ctx context.Context) error { return masquerade.CleanupIPTablesRules(ctx, mode) },
		},
	}
}

// ipsetPrefix names each feature's ipsets, which both iptables variants share: they go once
// neither variant's rules reference them.
var ipsetPrefix = [3]string{iptables.SetPrefix, guard.IPSetPrefix, masquerade.IPSetPrefix}

var featureNames = [3]string{"network policy", "guard", "masquerade"}

// removeLeftovers removes what f's backends of every kind but keep left in the kernel, and
// f's ipsets unless keep is an iptables kind, which uses them. The kinds are separate tables
// (and, for the two iptables variants, separate tools): they are cleaned up side by side, which
// halves what a cold start waits for here.
func removeLeftovers(ctx context.Context, f feature, keep backendchoice.Kind) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, k := range backendchoice.All {
		if k == keep {
			continue
		}
		wg.Go(func() {
			if err := kinds[k].leftovers[f](ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s %s: %w", k, featureNames[f], err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err // the sets stay while rules may still reference them
	}
	if _, iptablesInUse := keep.IPTablesMode(); iptablesInUse {
		return nil
	}
	if err := xtables.DestroyIPSets(ctx, ipsetPrefix[f]); err != nil {
		return fmt.Errorf("%s ipsets: %w", featureNames[f], err)
	}
	return nil
}

// cleanup removes what every backend of each feature fs left in the kernel: for
// `netwarden cleanup`, and for a feature turned off.
func cleanup(ctx context.Context, fs ...feature) error {
	var errs []error
	for _, f := range fs {
		errs = append(errs, removeLeftovers(ctx, f, ""))
		if f == networkPolicyRules {
			// The learner of domain names' addresses queues DNS replies from tables of its
			// own, whatever the backend: they go with the feature, not with a backend kind.
			errs = append(errs, domains.Cleanup(ctx))
		}
	}
	return errors.Join(errs...)
}

// retireOthers returns the clean-up, after the first sync, of what backends of kinds other than
// chosen left for the features fs: when auto picks iptables after a host lost nft, or an
// operator changes --backend, the old rules must not keep judging packets beside the new ones.
func retireOthers(chosen backendchoice.Kind, fs ...feature) func(context.Context) error {
	return func(ctx context.Context) error {
		var errs []error
		for _, f := range fs {
			errs = append(errs, removeLeftovers(ctx, f, chosen))
		}
		return errors.Join(errs...)
	}
}

// openBackend opens feature backend of the kind --backend (auto, nftables or iptables) asks
// for, chosen as backendchoice says. The caller logs the choice with the backend's Name(),
// which says the iptables variant too.
func openBackend[T any](ctx context.Context, name string, open func(kindBackends) func(context.Context) (T, error)) (T, backendchoice.Kind, error) {
	b, k, err := backendchoice.Open(ctx, name, func(ctx context.Context, k backendchoice.Kind) (T, error) {
		return open(kinds[k])(ctx)
	})
	if err != nil {
		return b, k, fmt.Errorf("--backend %q: %w", name, err)
	}
	return b, k, nil
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
