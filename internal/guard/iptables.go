package guard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/netwarden/netwarden/internal/xtables"
)

// IPTablesChain is the guard's chain in the mangle table (PREROUTING jumps to it first), apart
// from the NetworkPolicy chains of the filter table, whose clean-up never meets it.
const IPTablesChain = "NETWARDEN-GUARD"

// IPTables is the guard for the iptables backend.
type IPTables struct {
	run     *xtables.Runner
	applied *Desired
}

// NewIPTables returns the guard for one iptables variant.
func NewIPTables(r *xtables.Runner) *IPTables { return &IPTables{run: r} }

func (g *IPTables) Name() string { return "iptables-" + string(g.run.Mode) }

// Sync implements Guard.
func (g *IPTables) Sync(ctx context.Context, d Desired) error {
	d = normalize(d)
	if len(d.PodCIDRs) > 0 {
		return errors.New("guard: dropping traffic of unknown local pods needs the nftables backend")
	}
	if sameRules(g.applied, &d) {
		return nil
	}
	g.applied = nil
	for _, fam := range xtables.Families {
		var in bytes.Buffer
		fmt.Fprintf(&in, "*mangle\n:%s - [0:0]\n", IPTablesChain)
		if d.DenyMark != 0 {
			fmt.Fprintf(&in, "-A %s -m connmark --mark 0x%x/0x%x -m comment --comment \"an established flow a policy now denies\" -j DROP\n",
				IPTablesChain, d.DenyMark, d.DenyMark)
		}
		in.WriteString("COMMIT\n")
		if err := g.run.Restore(ctx, fam, in.Bytes()); err != nil {
			return fmt.Errorf("guard: %w", err)
		}
		// The jump goes first in PREROUTING, ahead of anything that could accept the packet.
		if _, err := g.run.Run(ctx, fam, "-t", "mangle", "-C", "PREROUTING", "-j", IPTablesChain); err != nil {
			if _, err := g.run.Run(ctx, fam, "-t", "mangle", "-I", "PREROUTING", "1", "-j", IPTablesChain); err != nil {
				return fmt.Errorf("guard: %w", err)
			}
		}
	}
	g.applied = &d
	return nil
}

// Cleanup implements Guard.
func (g *IPTables) Cleanup(ctx context.Context) error {
	g.applied = nil
	var errs []error
	for _, fam := range xtables.Families {
		out, err := g.run.Save(ctx, fam, "mangle")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !strings.Contains(string(out), ":"+IPTablesChain+" ") {
			continue
		}
		for strings.Contains(string(out), "-A PREROUTING -j "+IPTablesChain) {
			if _, err := g.run.Run(ctx, fam, "-t", "mangle", "-D", "PREROUTING", "-j", IPTablesChain); err != nil {
				errs = append(errs, err)
				break
			}
			if out, err = g.run.Save(ctx, fam, "mangle"); err != nil {
				errs = append(errs, err)
				break
			}
		}
		in := fmt.Sprintf("*mangle\n:%s - [0:0]\n-X %s\nCOMMIT\n", IPTablesChain, IPTablesChain)
		if err := g.run.Restore(ctx, fam, []byte(in)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
