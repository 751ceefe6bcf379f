package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/netwarden/netwarden/internal/agent"
	"github.com/netwarden/netwarden/internal/backendchoice"
	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/masquerade"
)

// masqFlags are the masquerade feature's flags, named as ip-masq-agent names them where it
// has the same setting.
type masqFlags struct {
	enabled           bool
	configPath        string
	noMasqCIDRs       []string
	allReservedRanges bool
	randomFully       bool
	allSources        bool
}

func (f *masqFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&f.enabled, "masquerade", true, "masquerade (SNAT) pod traffic that leaves the cluster")
	fs.StringVar(&f.configPath, "masq-config", "", "ip-masq-agent config file (YAML or JSON), watched; absent file or empty flag: ip-masq-agent's defaults")
	fs.StringArrayVar(&f.noMasqCIDRs, "no-masquerade-cidr", nil, "a destination CIDR that keeps the pod's address, in addition to the config file's (repeatable)")
	fs.BoolVar(&f.allReservedRanges, "nomasq-all-reserved-ranges", false, "add all IPv4 ranges reserved by RFCs to the default non-masquerade CIDRs (as ip-masq-agent's flag)")
	fs.BoolVar(&f.randomFully, "random-fully", true, "fully randomise the source port of masqueraded connections")
	fs.BoolVar(&f.allSources, "masquerade-all-sources", false, "masquerade traffic from any source, not only from this node's podCIDRs")
}

func (f *masqFlags) options() (masquerade.Options, error) {
	opts := masquerade.Options{AllReservedRanges: f.allReservedRanges, RandomFully: f.randomFully, AllSources: f.allSources}
	for _, s := range f.noMasqCIDRs {
		p, err := masquerade.ParseAlignedCIDR(s)
		if err != nil {
			return opts, fmt.Errorf("--no-masquerade-cidr: %w", err)
		}
		opts.ExtraNonMasqueradeCIDRs = append(opts.ExtraNonMasqueradeCIDRs, p)
	}
	return opts, nil
}

// config builds the agent's masquerade feature, or nil when it is off. A config file that is
// invalid at start is not fatal: the agent enforces NetworkPolicy, reports the error, and
// applies masquerade once the file is fixed.
func (f *masqFlags) config(ctx context.Context, backend string, log *slog.Logger) (*agent.Masquerade, error) {
	if !f.enabled {
		return nil, nil
	}
	opts, err := f.options()
	if err != nil {
		return nil, err
	}
	b, k, err := openBackend(ctx, backend, func(kb kindBackends) func(context.Context) (masquerade.Backend, error) { return kb.masquerade })
	if err != nil {
		return nil, err
	}
	log.Info("masquerade backend selected", "backend", b.Name(), "requested", backend)
	return &agent.Masquerade{Backend: b, Config: masquerade.NewConfigFile(f.configPath, f.allReservedRanges, log), Options: opts,
		RetireOthers: retireOthers(k, masqueradeRules)}, nil
}

// renderMasquerade returns the masquerade rules that the agent would apply for st.
func (f *masqFlags) render(ctx context.Context, backend string, st *cluster.State, node string) (string, error) {
	opts, err := f.options()
	if err != nil {
		return "", err
	}
	cfg := masquerade.DefaultConfig(f.allReservedRanges)
	if f.configPath != "" {
		if cfg, _, err = masquerade.LoadConfig(f.configPath, f.allReservedRanges); err != nil {
			return "", err
		}
	}
	d := masquerade.Compute(cfg, opts, st.Nodes, node)
	switch backend {
	case "auto", "nftables":
		return (&masquerade.NFTables{}).Render(d), nil
	case "iptables":
		// Rendering touches nothing: the variant iptables would try first.
		kinds, err := backendchoice.Candidates(backend)
		if err != nil {
			return "", err
		}
		mode, _ := kinds[0].IPTablesMode()
		return masquerade.NewIPTables(&xtables.Runner{Mode: mode}).Render(d), nil
	}
	return "", fmt.Errorf("--backend %q: want auto, nftables or iptables", backend)
}
