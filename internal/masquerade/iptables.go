package masquerade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// IPTablesChain is our chain in the nat table of both families.
const IPTablesChain = "NETWARDEN-MASQ"

// jumpSpec is the one rule we add to POSTROUTING; like ip-masq-agent's, it skips local
// destinations before the jump.
var jumpSpec = []string{"-m", "comment", "--comment", "netwarden masquerade", "-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", IPTablesChain}

// IPTables is the iptables backend: one chain in the nat table with a constant four rules, one
// jump from POSTROUTING, and the ranges in ipsets (hash:net), so a config or Node change is an
// ipset update and the rules a packet crosses do not grow with the number of CIDRs.
type IPTables struct {
	run     *xtables.Runner
	applied *Desired
}

// NewIPTables returns the backend for one iptables variant.
func NewIPTables(r *xtables.Runner) *IPTables { return &IPTables{run: r} }

// Name implements Backend.
func (b *IPTables) Name() string { return "iptables-" + string(b.run.Mode) }

// ipsetName names our sets "nwmasq-*": the NetworkPolicy backend owns every "netwarden-*" set
// and removes those it does not want.
func ipsetName(k setKind) string { return k.name(IPSetPrefix+"src", IPSetPrefix+"nomasq-dst") }

// IPSetPrefix begins the name of every ipset of the iptables backend (and of its swap copies).
const IPSetPrefix = "nwmasq-"

func ipsetFamily(k setKind) string {
	if k.family == 1 {
		return "inet6"
	}
	return "inet"
}

// chainRules are the rules of our chain for one family, as iptables-restore lines.
func chainRules(fam int, randomFully bool) []string {
	masq := "-A " + IPTablesChain + " -j MASQUERADE"
	if randomFully {
		masq += " --random-fully"
	}
	return []string{
		fmt.Sprintf("-A %s -m set ! --match-set %s src -j RETURN", IPTablesChain, ipsetName(setKind{fam, true})),
		fmt.Sprintf("-A %s -m set --match-set %s dst -j RETURN", IPTablesChain, ipsetName(setKind{fam, false})),
		masq,
	}
}

func restoreInput(fam int, randomFully bool) []byte {
	var buf bytes.Buffer
	buf.WriteString("*nat\n:" + IPTablesChain + " - [0:0]\n")
	for _, r := range chainRules(fam, randomFully) {
		buf.WriteString(r + "\n")
	}
	buf.WriteString("COMMIT\n")
	return buf.Bytes()
}

func element(p netip.Prefix) string { return p.String() }

// hashNetMembers returns the members of a hash:net set that cover exactly r.
func hashNetMembers(r Range) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range r.Prefixes() {
		out = append(out, xtables.HashNetPrefixes(p)...)
	}
	return out
}

// setScript fills each set from scratch through a temporary set swapped in, so no packet
// ever sees a set that is empty or half filled, and a set that our rules reference (and so
// cannot be destroyed) is still replaced.
func setScript(d *Desired) []byte {
	var buf bytes.Buffer
	for _, k := range setKinds {
		name, tmp := ipsetName(k), ipsetName(k)+"-tmp"
		fmt.Fprintf(&buf, "create %s hash:net family %s -exist\n", name, ipsetFamily(k))
		fmt.Fprintf(&buf, "create %s hash:net family %s -exist\n", tmp, ipsetFamily(k))
		fmt.Fprintf(&buf, "flush %s\n", tmp)
		for _, r := range k.ranges(d) {
			for _, p := range hashNetMembers(r) {
				fmt.Fprintf(&buf, "add %s %s\n", tmp, element(p))
			}
		}
		fmt.Fprintf(&buf, "swap %s %s\ndestroy %s\n", tmp, name, tmp)
	}
	return buf.Bytes()
}

// Render implements Backend.
func (b *IPTables) Render(d *Desired) string {
	var sb strings.Builder
	sb.WriteString("# ipset restore\n")
	sb.Write(setScript(d))
	for fam, tool := range []string{"iptables", "ip6tables"} {
		fmt.Fprintf(&sb, "# %s-restore --noflush\n", tool)
		sb.Write(restoreInput(fam, d.RandomFully))
		fmt.Fprintf(&sb, "# %s -t nat -A POSTROUTING %s\n", tool, strings.Join(quoteArgs(jumpSpec), " "))
	}
	return sb.String()
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.Contains(a, " ") {
			a = `"` + a + `"`
		}
		out[i] = a
	}
	return out
}

// FullSync implements Backend. The order keeps traffic correct at every step: sets first
// (swapped in whole), then our chain (one restore per family replaces it atomically), then the
// jump, which exists at most once.
func (b *IPTables) FullSync(ctx context.Context, d *Desired) (dataplane.SyncResult, error) {
	b.applied = nil
	if err := xtables.IPSetRestore(ctx, setScript(d)); err != nil {
		return dataplane.SyncResult{Full: true}, err
	}
	for fam, family := range xtables.Families {
		if err := b.run.Restore(ctx, family, restoreInput(fam, d.RandomFully)); err != nil {
			return dataplane.SyncResult{Full: true}, err
		}
		if err := b.ensureJump(ctx, family); err != nil {
			return dataplane.SyncResult{Full: true}, err
		}
	}
	b.applied = d
	return dataplane.SyncResult{Full: true, Operations: 1, Size: size(d)}, nil
}

func (b *IPTables) ensureJump(ctx context.Context, fam xtables.Family) error {
	if _, err := b.run.Run(ctx, fam, append([]string{"-t", "nat", "-C", "POSTROUTING"}, jumpSpec...)...); err == nil {
		return nil
	}
	if _, err := b.run.Run(ctx, fam, append([]string{"-t", "nat", "-A", "POSTROUTING"}, jumpSpec...)...); err != nil {
		return fmt.Errorf("adding the jump to %s: %w", IPTablesChain, err)
	}
	return nil
}

// Sync implements Backend: after the first sync a change is one ipset batch that adds the new
// prefixes before it deletes the old ones, so an address covered before and after is never
// uncovered in between.
func (b *IPTables) Sync(ctx context.Context, d *Desired) (dataplane.SyncResult, error) {
	if b.applied == nil || b.applied.RandomFully != d.RandomFully {
		return b.FullSync(ctx, d)
	}
	var adds, dels bytes.Buffer
	ops := 0
	for _, k := range setKinds {
		have, want := prefixSet(k.ranges(b.applied)), prefixSet(k.ranges(d))
		for p := range want {
			if !have[p] {
				fmt.Fprintf(&adds, "add %s %s -exist\n", ipsetName(k), element(p))
				ops++
			}
		}
		for p := range have {
			if !want[p] {
				fmt.Fprintf(&dels, "del %s %s -exist\n", ipsetName(k), element(p))
				ops++
			}
		}
	}
	if ops == 0 {
		return dataplane.SyncResult{Size: size(d)}, nil
	}
	if err := xtables.IPSetRestore(ctx, append(adds.Bytes(), dels.Bytes()...)); err != nil {
		res, ferr := b.FullSync(ctx, d)
		res.Fallback = err.Error()
		return res, ferr
	}
	b.applied = d
	return dataplane.SyncResult{Operations: ops, Size: size(d)}, nil
}

func prefixSet(rs []Range) map[netip.Prefix]bool {
	m := map[netip.Prefix]bool{}
	for _, r := range rs {
		for _, p := range hashNetMembers(r) {
			m[p] = true
		}
	}
	return m
}

// Verify implements Backend: the jump, our chain's rules and every set's members.
func (b *IPTables) Verify(ctx context.Context) error {
	if b.applied == nil {
		return errors.New("nothing applied yet")
	}
	for fam, family := range xtables.Families {
		if _, err := b.run.Run(ctx, family, append([]string{"-t", "nat", "-C", "POSTROUTING"}, jumpSpec...)...); err != nil {
			return fmt.Errorf("%s: the jump from POSTROUTING to %s is missing", b.run.Command(family, ""), IPTablesChain)
		}
		out, err := b.run.Run(ctx, family, "-t", "nat", "-S", IPTablesChain)
		if err != nil {
			return fmt.Errorf("%s: chain %s: %w", b.run.Command(family, ""), IPTablesChain, err)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if strings.HasPrefix(line, "-A ") {
				got = append(got, line)
			}
		}
		want := chainRules(fam, b.applied.RandomFully)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			return fmt.Errorf("%s: chain %s was changed:\n%s", b.run.Command(family, ""), IPTablesChain, strings.Join(got, "\n"))
		}
	}
	for _, k := range setKinds {
		members, err := xtables.IPSetMembers(ctx, ipsetName(k))
		if err != nil {
			return fmt.Errorf("ipset %s: %w", ipsetName(k), err)
		}
		var have []Range
		for _, m := range members {
			r, err := parseRange(strings.Fields(m)[0])
			if err != nil {
				return fmt.Errorf("ipset %s: %w", ipsetName(k), err)
			}
			have = append(have, r)
		}
		if want := k.ranges(b.applied); !sameAddresses(have, want, k.family == 1) {
			return fmt.Errorf("ipset %s holds %d members, not the %d ranges last applied", ipsetName(k), len(have), len(want))
		}
	}
	return nil
}

// Cleanup implements Backend. It removes our jump, chain and sets from both iptables variants,
// because an earlier agent may have used the other one.
func (b *IPTables) Cleanup(ctx context.Context) error {
	err := CleanupIPTablesRules(ctx, xtables.ModeNFT, xtables.ModeLegacy)
	b.applied = nil
	return errors.Join(err, cleanupIPSets(ctx))
}

// CleanupIPTablesRules removes our jump and chain from the given iptables variants, both
// families; a variant that does not work here holds nothing of ours.
func CleanupIPTablesRules(ctx context.Context, modes ...xtables.Mode) error {
	var errs []error
	for _, mode := range modes {
		r := &xtables.Runner{Mode: mode}
		for _, family := range xtables.Families {
			if !xtables.TablePresent(mode, family, "nat") {
				continue // no table, no jump or chain of ours: no commands to run
			}
			if _, err := r.Save(ctx, family, "nat"); err != nil {
				continue // this variant is not usable here, so it holds nothing of ours
			}
			for range 100 { // every copy of the jump, however many someone added
				if _, err := r.Run(ctx, family, append([]string{"-t", "nat", "-D", "POSTROUTING"}, jumpSpec...)...); err != nil {
					break
				}
			}
			if ok, err := r.ChainExists(ctx, family, "nat", IPTablesChain); err == nil && ok {
				if _, err := r.Run(ctx, family, "-t", "nat", "-F", IPTablesChain); err != nil {
					errs = append(errs, err)
				}
				if _, err := r.Run(ctx, family, "-t", "nat", "-X", IPTablesChain); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func cleanupIPSets(ctx context.Context) error { return xtables.DestroyIPSets(ctx, IPSetPrefix) }

// KernelTables implements dataplane.KernelTables.
func (b *IPTables) KernelTables() []dataplane.KernelTable {
	legacy := b.run.Mode == xtables.ModeLegacy
	return []dataplane.KernelTable{{Family: "ip", Name: "nat", Legacy: legacy}, {Family: "ip6", Name: "nat", Legacy: legacy}}
}
