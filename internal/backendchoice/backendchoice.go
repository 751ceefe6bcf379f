// Package backendchoice decides which kernel interface a component programs: nftables where
// nft works, else iptables-nft, else iptables-legacy. The agent's NetworkPolicy and masquerade
// backends, both CNI plugins and cleanup choose through it, so that on one host they agree,
// and $NETWARDEN_IPTABLES_MODE is read here only.
package backendchoice

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// Kind is a kernel interface a backend can program.
type Kind string

const (
	NFTables       Kind = "nftables"
	IPTablesNFT    Kind = "iptables-nft"
	IPTablesLegacy Kind = "iptables-legacy"
)

// All is every kind, in the order auto prefers them.
var All = []Kind{NFTables, IPTablesNFT, IPTablesLegacy}

// ModeEnv pins the iptables variant ("nft" or "legacy"): a request for iptables, or auto on a
// host without nft, then tries only that variant.
const ModeEnv = "NETWARDEN_IPTABLES_MODE"

// IPTablesMode is the iptables variant of k; ok is false for nftables.
func (k Kind) IPTablesMode() (mode xtables.Mode, ok bool) {
	switch k {
	case IPTablesNFT:
		return xtables.ModeNFT, true
	case IPTablesLegacy:
		return xtables.ModeLegacy, true
	}
	return "", false
}

// KindOf is the kind of an iptables variant.
func KindOf(mode xtables.Mode) Kind { return Kind("iptables-" + string(mode)) }

// Candidates returns the kinds a request admits, in order of preference: "auto" (or empty)
// admits all, "iptables" both variants or the one $NETWARDEN_IPTABLES_MODE pins, and a kind's
// own name that kind.
func Candidates(requested string) ([]Kind, error) {
	switch requested {
	case "", "auto":
		ipt, err := iptablesVariants()
		return append([]Kind{NFTables}, ipt...), err
	case "iptables":
		return iptablesVariants()
	case string(NFTables), string(IPTablesNFT), string(IPTablesLegacy):
		return []Kind{Kind(requested)}, nil
	}
	return nil, errors.New("want auto, nftables or iptables")
}

func iptablesVariants() ([]Kind, error) {
	s := os.Getenv(ModeEnv)
	if s == "" {
		return []Kind{IPTablesNFT, IPTablesLegacy}, nil
	}
	mode, err := xtables.ParseMode(s)
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", ModeEnv, err)
	}
	return []Kind{KindOf(mode)}, nil
}

// Open opens the first candidate of requested that open accepts, and says which it was. The
// error names every candidate's failure.
func Open[T any](ctx context.Context, requested string, open func(context.Context, Kind) (T, error)) (T, Kind, error) {
	var zero T
	kinds, err := Candidates(requested)
	if err != nil {
		return zero, "", err
	}
	var errs []error
	for _, k := range kinds {
		v, err := open(ctx, k)
		if err == nil {
			return v, k, nil
		}
		errs = append(errs, fmt.Errorf("%s unusable: %w", k, err))
	}
	return zero, "", errors.Join(errs...)
}
