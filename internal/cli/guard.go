package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/netwarden/netwarden/internal/agent"
	"github.com/netwarden/netwarden/internal/gateproto"
	"github.com/netwarden/netwarden/internal/guard"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/xtables"
)

// guardFlags choose what happens to established flows a policy change denies.
type guardFlags struct {
	keepEstablished bool
	denyMark        string
	gateSocket      string
}

func (f *guardFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&f.keepEstablished, "keep-established", false,
		"let flows that were established before a policy change denied them go on (Calico's behaviour); by default they are stopped")
	fs.StringVar(&f.denyMark, "conntrack-deny-mark", fmt.Sprintf("0x%x", agent.DefaultDenyMark),
		"the conntrack mark bit(s) that flag an established flow a policy now denies; no other component may use them")
	fs.StringVar(&f.gateSocket, "gate-socket", "",
		"serve the netwarden-gate CNI plugin on this unix socket (such as "+gateproto.DefaultSocket+"): a pod starts once its verdicts are installed, "+
			"and traffic of addresses in this node's podCIDRs that the agent has no verdicts for is dropped; empty disables")
}

// check rejects flags that would be ignored.
func (f *guardFlags) check(networkPolicy bool) error {
	if f.gateSocket != "" && !networkPolicy {
		return fmt.Errorf("--gate-socket needs --network-policy: the gate waits for a pod's NetworkPolicy verdicts")
	}
	return nil
}

// apply sets the agent's guard for the policy backend chosen.
func (f *guardFlags) apply(cfg *agent.Config, backend policy.Backend) error {
	mark, err := strconv.ParseUint(f.denyMark, 0, 32)
	if err != nil || mark == 0 {
		return fmt.Errorf("--conntrack-deny-mark %q: want a non-zero 32-bit mask such as 0x%x", f.denyMark, agent.DefaultDenyMark)
	}
	if !f.keepEstablished {
		cfg.DenyMark = uint32(mark)
	}
	if f.gateSocket != "" && !filepath.IsAbs(f.gateSocket) {
		return fmt.Errorf("--gate-socket %q: want an absolute path", f.gateSocket)
	}
	cfg.GateSocket = f.gateSocket
	switch b := backend.(type) {
	case *iptables.Backend:
		cfg.Guard = guard.NewIPTables(&xtables.Runner{Mode: b.Mode()})
	case *nftables.Backend:
		// Probed at its first use: the backend's own probe has shown that nft works.
		cfg.Guard = guard.NewNFTables()
	}
	return nil
}

// cleanupGuards removes the guard of every backend but except; absent ones, and variants that
// do not work here, are not an error. Each variant costs one save per family when it holds
// nothing of ours, since cleanup runs on every start with the feature off.
func cleanupGuards(ctx context.Context, except guard.Guard) error {
	var errs []error
	// The guard in use is known by its type before a probe of nft (two runs of it) is paid for.
	if _, nftInUse := except.(*guard.NFTables); !nftInUse {
		if g := guard.NewNFTables(); g.Probe() == nil && (except == nil || except.Name() != g.Name()) {
			errs = append(errs, g.Cleanup(ctx))
		}
	}
	_, iptInUse := except.(*guard.IPTables)
	for _, m := range []xtables.Mode{xtables.ModeNFT, xtables.ModeLegacy} {
		g := guard.NewIPTables(&xtables.Runner{Mode: m})
		g.KeepSets = iptInUse // the variant in use references them
		if except != nil && except.Name() == g.Name() {
			continue
		}
		if err := g.Cleanup(ctx); err != nil && !errors.Is(err, guard.ErrUnusable) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// retireOtherGuards adds to retire the clean-up of the guards other than the one in use.
func retireOtherGuards(retire func(context.Context) error, inUse guard.Guard) func(context.Context) error {
	return func(ctx context.Context) error {
		var err error
		if retire != nil {
			err = retire(ctx)
		}
		return errors.Join(err, cleanupGuards(ctx, inUse))
	}
}
