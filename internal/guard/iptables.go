package guard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// The guard's chains in the mangle table, jumped to first from PREROUTING and FORWARD, apart
// from the NetworkPolicy chains of the filter table, whose clean-up never meets them.
const (
	IPTablesChain        = "NETWARDEN-GUARD"
	IPTablesForwardChain = "NETWARDEN-GUARD-FWD"
)

// IPSetPrefix names the guard's ipsets, apart from the NetworkPolicy backend's netwarden-*
// sets, which that backend destroys whole on clean-up.
const IPSetPrefix = "nwguard-"

// IPTables is the guard for the iptables backend.
type IPTables struct {
	run     *xtables.Runner
	applied *Desired
	// keepSets makes Cleanup leave the ipsets alone, for retiring one variant's chains while the
	// other variant's guard uses the sets (ipsets are shared by both variants).
	keepSets bool
}

// NewIPTables returns the guard for one iptables variant.
func NewIPTables(r *xtables.Runner) *IPTables { return &IPTables{run: r} }

func (g *IPTables) Name() string { return "iptables-" + string(g.run.Mode) }

func ipsetName(kind string, fam xtables.Family) string {
	if fam == xtables.IPv6 {
		return IPSetPrefix + kind + "6"
	}
	return IPSetPrefix + kind + "4"
}

func famOf(a netip.Addr) xtables.Family {
	if a.Is6() {
		return xtables.IPv6
	}
	return xtables.IPv4
}

// Sync implements Guard. A change of known pods only adds and removes set members.
func (g *IPTables) Sync(ctx context.Context, d Desired) error {
	d = normalize(d)
	if sameRules(g.applied, &d) {
		add, del := diffAddrs(g.applied.Known, d.Known)
		if len(add)+len(del) == 0 {
			return nil
		}
		var script bytes.Buffer
		for _, a := range del {
			fmt.Fprintf(&script, "del %s %s -exist\n", ipsetName("known", famOf(a)), a)
		}
		for _, a := range add {
			fmt.Fprintf(&script, "add %s %s -exist\n", ipsetName("known", famOf(a)), a)
		}
		if err := xtables.IPSetRestore(ctx, script.Bytes()); err != nil {
			g.applied = nil
			return fmt.Errorf("guard: %w", err)
		}
		g.applied = &d
		return nil
	}
	g.applied = nil
	if err := g.writeSets(ctx, d); err != nil {
		return err
	}
	for _, fam := range xtables.Families {
		var in bytes.Buffer
		fmt.Fprintf(&in, "*mangle\n:%s - [0:0]\n:%s - [0:0]\n", IPTablesChain, IPTablesForwardChain)
		for _, r := range iptablesRules(d, fam) {
			fmt.Fprintf(&in, "-A %s %s\n", r[0], r[1])
		}
		in.WriteString("COMMIT\n")
		if err := g.run.Restore(ctx, fam, in.Bytes()); err != nil {
			return fmt.Errorf("guard: %w", err)
		}
		// The jumps go first, ahead of anything that could accept the packet.
		for _, j := range [][2]string{{"PREROUTING", IPTablesChain}, {"FORWARD", IPTablesForwardChain}} {
			if _, err := g.run.Run(ctx, fam, "-t", "mangle", "-C", j[0], "-j", j[1]); err != nil {
				if _, err := g.run.Run(ctx, fam, "-t", "mangle", "-I", j[0], "1", "-j", j[1]); err != nil {
					return fmt.Errorf("guard: %w", err)
				}
			}
		}
	}
	g.applied = &d
	return nil
}

// iptablesRules are the guard's rules of one family, as chain and spec in iptables-save's
// spelling (Verify compares them with its output).
func iptablesRules(d Desired, fam xtables.Family) [][2]string {
	var out [][2]string
	if d.DenyMark != 0 {
		out = append(out, [2]string{IPTablesChain, fmt.Sprintf("-m connmark --mark 0x%x/0x%x -m comment --comment \"an established flow a policy now denies\" -j DROP",
			d.DenyMark, d.DenyMark)})
	}
	if hasFamily(d.PodCIDRs, fam == xtables.IPv6) {
		cidr, known := ipsetName("cidr", fam), ipsetName("known", fam)
		out = append(out,
			[2]string{IPTablesChain, fmt.Sprintf("-m set --match-set %s src -m set ! --match-set %s src -m comment --comment \"from a local pod without verdicts yet\" -j DROP", cidr, known)},
			[2]string{IPTablesForwardChain, fmt.Sprintf("-m set --match-set %s dst -m set ! --match-set %s dst -m comment --comment \"to a local pod without verdicts yet\" -j DROP", cidr, known)})
	}
	return out
}

// Invalidate implements Guard.
func (g *IPTables) Invalidate() { g.applied = nil }

// Verify implements Guard: both chains with exactly their rules, each jumped to from its
// built-in chain ahead of every other component's rules, and both sets of each family with
// exactly their members.
func (g *IPTables) Verify(ctx context.Context) error {
	d := g.applied
	if d == nil {
		return nil
	}
	for _, fam := range xtables.Families {
		out, err := g.run.Save(ctx, fam, "mangle")
		if err != nil {
			return drifted("%s", err)
		}
		rules := map[string][]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if chain, spec, ok := strings.Cut(strings.TrimPrefix(line, "-A "), " "); ok && strings.HasPrefix(line, "-A ") {
				rules[chain] = append(rules[chain], spec)
			}
		}
		want := map[string][]string{}
		for _, r := range iptablesRules(*d, fam) {
			want[r[0]] = append(want[r[0]], r[1])
		}
		for _, c := range []string{IPTablesChain, IPTablesForwardChain} {
			if !strings.Contains(string(out), "\n:"+c+" ") {
				return drifted("%s mangle chain %s missing", fam, c)
			}
			if !slices.Equal(rules[c], want[c]) {
				return drifted("%s mangle chain %s has %d rules that differ from the %d applied", fam, c, len(rules[c]), len(want[c]))
			}
		}
		for _, j := range [][2]string{{"PREROUTING", IPTablesChain}, {"FORWARD", IPTablesForwardChain}} {
			found := false
			for _, r := range rules[j[0]] {
				if r == "-j "+j[1] {
					found = true
					break
				}
				if !strings.HasPrefix(r, "-j NETWARDEN-") {
					return drifted("%s mangle %s has a rule of another component ahead of the jump to %s: %s", fam, j[0], j[1], r)
				}
			}
			if !found {
				return drifted("%s mangle %s does not jump to %s", fam, j[0], j[1])
			}
		}
	}
	for _, fam := range xtables.Families {
		known, cidrs := d.members(fam == xtables.IPv6)
		for kind, want := range map[string][]string{"known": known, "cidr": cidrs} {
			name := ipsetName(kind, fam)
			got, err := xtables.IPSetMembers(ctx, name)
			if err != nil {
				return drifted("%s", err)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return drifted("ipset %s holds %d members, want %d", name, len(got), len(want))
			}
		}
	}
	return nil
}

// writeSets makes the sets hold d, each replaced whole by a swap so that no packet meets a set
// half filled.
func (g *IPTables) writeSets(ctx context.Context, d Desired) error {
	var script bytes.Buffer
	for _, fam := range xtables.Families {
		family := "inet"
		if fam == xtables.IPv6 {
			family = "inet6"
		}
		for _, kind := range []string{"known", "cidr"} {
			typ := "hash:ip"
			if kind == "cidr" {
				typ = "hash:net"
			}
			name, tmp := ipsetName(kind, fam), ipsetName(kind, fam)+"-tmp"
			fmt.Fprintf(&script, "create %s %s family %s -exist\n", name, typ, family)
			fmt.Fprintf(&script, "create %s %s family %s -exist\nflush %s\n", tmp, typ, family, tmp)
			if kind == "known" {
				for _, a := range d.Known {
					if famOf(a) == fam {
						fmt.Fprintf(&script, "add %s %s\n", tmp, a)
					}
				}
			} else {
				for _, p := range d.PodCIDRs {
					if famOf(p.Addr()) == fam {
						fmt.Fprintf(&script, "add %s %s\n", tmp, p.Masked())
					}
				}
			}
			fmt.Fprintf(&script, "swap %s %s\ndestroy %s\n", tmp, name, tmp)
		}
	}
	if err := xtables.IPSetRestore(ctx, script.Bytes()); err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	return nil
}

// errUnusable is what Cleanup returns when the variant's commands do not work here, so
// nothing of ours can be there either.
var errUnusable = errors.New("iptables variant not usable")

// Cleanup implements Guard.
func (g *IPTables) Cleanup(ctx context.Context) error {
	g.applied = nil
	var errs []error
	for _, fam := range xtables.Families {
		if !xtables.TablePresent(g.run.Mode, fam, "mangle") {
			continue // no table, no chains of ours: no save to run
		}
		out, err := g.run.Save(ctx, fam, "mangle")
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", errUnusable, err))
			continue
		}
		for _, j := range [][2]string{{"PREROUTING", IPTablesChain}, {"FORWARD", IPTablesForwardChain}} {
			for n := strings.Count(string(out), "-A "+j[0]+" -j "+j[1]+"\n"); n > 0; n-- {
				if _, err := g.run.Run(ctx, fam, "-t", "mangle", "-D", j[0], "-j", j[1]); err != nil {
					errs = append(errs, err)
					break
				}
			}
		}
		var in bytes.Buffer
		in.WriteString("*mangle\n")
		for _, c := range []string{IPTablesChain, IPTablesForwardChain} {
			if strings.Contains(string(out), ":"+c+" ") {
				fmt.Fprintf(&in, ":%s - [0:0]\n-X %s\n", c, c)
			}
		}
		in.WriteString("COMMIT\n")
		if in.Len() > len("*mangle\nCOMMIT\n") {
			if err := g.run.Restore(ctx, fam, in.Bytes()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil || g.keepSets {
		return err
	}
	return xtables.DestroyIPSets(ctx, IPSetPrefix)
}

// CleanupIPTables removes the chains and jumps (not the ipsets, which both variants share) that
// a guard of variant mode left; nothing where that variant does not work.
func CleanupIPTables(ctx context.Context, mode xtables.Mode) error {
	g := NewIPTables(&xtables.Runner{Mode: mode})
	g.keepSets = true
	if err := g.Cleanup(ctx); err != nil && !errors.Is(err, errUnusable) {
		return err
	}
	return nil
}

// KernelTables implements dataplane.KernelTables.
func (g *IPTables) KernelTables() []dataplane.KernelTable {
	legacy := g.run.Mode == xtables.ModeLegacy
	return []dataplane.KernelTable{{Family: "ip", Name: "mangle", Legacy: legacy}, {Family: "ip6", Name: "mangle", Legacy: legacy}}
}
