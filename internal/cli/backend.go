package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
)

// policyBackend picks the NetworkPolicy backend for --backend.
func policyBackend(_ context.Context, name string) (dataplane.PolicyBackend, error) {
	switch name {
	case "auto", "nftables":
		b, err := nftables.New()
		if err != nil {
			return nil, fmt.Errorf("--backend %s: nftables unusable: %w", name, err)
		}
		return b, nil
	case "iptables":
		return nil, errors.New("--backend iptables: the iptables backend is not available in this build; use nftables")
	}
	return nil, fmt.Errorf("--backend %q: want auto, nftables or iptables", name)
}

// renderPolicy returns the complete NetworkPolicy ruleset that --backend would apply.
func renderPolicy(_ context.Context, name string, rs *policy.Ruleset) (string, error) {
	switch name {
	case "auto", "nftables":
		return nftables.NewWithInterface(nil).Render(rs), nil
	}
	return "", fmt.Errorf("--backend %q: render supports auto and nftables", name)
}

// cleanupPolicy removes the NetworkPolicy rules of every backend that may have installed them.
func cleanupPolicy(ctx context.Context) error {
	b, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return b.Cleanup(ctx)
}
