package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/netwarden/netwarden/internal/policy"
)

// dropFlags configure drop logging (agent --log-drops).
type dropFlags struct {
	enabled     bool
	staged      bool // --log-staged
	rate, burst uint32
	group       uint16
	// counters is --policy-counters, which goes with the other observability flags.
	counters bool
}

// maxLogRate is the most that both backends take: iptables' limit match refuses a rate
// above 10,000 a second, and a burst above 10,000.
const maxLogRate = 10000

func (f *dropFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&f.enabled, "log-drops", false,
		"log each connection attempt that policy denies (source and destination pod, protocol, port, direction, deciding policy) and count it in netwarden_dropped_packets_total")
	fs.BoolVar(&f.staged, "log-staged", false,
		"log each new connection the staged policies (annotated netwarden.io/staged) would judge otherwise, as would-deny or would-allow, with the staged policy and rule; within --log-drops-rate and -burst, to --log-drops-group. Such connections are counted in netwarden_staged_verdicts_total either way")
	fs.Uint32Var(&f.rate, "log-drops-rate", 10,
		"packets a second each drop rule may log, limited in the kernel (1 to 10000); a flood beyond it is dropped unlogged")
	fs.Uint32Var(&f.burst, "log-drops-burst", 20, "packets each drop rule may log at once above --log-drops-rate (1 to 10000)")
	fs.BoolVar(&f.counters, "policy-counters", false,
		"count the packets each policy's rules accept or drop (the first of each connection) and export them as netwarden_policy_packets_total (nftables backend)")
	fs.Uint16Var(&f.group, "log-drops-group", 100,
		"NFLOG group the drops are logged to; one reader per group and network namespace, so no other program on the node may read it")
}

// config returns the drop log configuration the flags ask for, nil when it is off.
func (f *dropFlags) config(networkPolicy bool) (*policy.DropLog, error) {
	if !f.enabled {
		return nil, nil
	}
	return f.logConfig("--log-drops", networkPolicy)
}

// stagedConfig returns the staged verdict log configuration the flags ask for, nil when it
// is off.
func (f *dropFlags) stagedConfig(networkPolicy bool) (*policy.DropLog, error) {
	if !f.staged {
		return nil, nil
	}
	return f.logConfig("--log-staged", networkPolicy)
}

func (f *dropFlags) logConfig(flag string, networkPolicy bool) (*policy.DropLog, error) {
	if !networkPolicy {
		return nil, errors.New(flag + " needs NetworkPolicy enforcement, which is off")
	}
	if f.rate < 1 || f.rate > maxLogRate {
		return nil, fmt.Errorf("--log-drops-rate %d: want 1 to %d packets a second", f.rate, maxLogRate)
	}
	if f.burst < 1 || f.burst > maxLogRate {
		return nil, fmt.Errorf("--log-drops-burst %d: want 1 to %d packets", f.burst, maxLogRate)
	}
	return &policy.DropLog{Group: f.group, Rate: f.rate, Burst: f.burst}, nil
}
