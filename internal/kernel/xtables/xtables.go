// Package xtables runs the iptables, ip6tables and ipset commands that the iptables backends
// (NetworkPolicy, masquerade, the CNI plugins) share: one variant chosen per process (nft or
// legacy), every table change through `*-restore --noflush` holding the xtables lock, so we only
// ever touch the chains we name and never rewrite other components' rules.
package xtables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/netwarden/netwarden/internal/kernel/command"
)

// Mode is the iptables variant: the nf_tables-based one or the legacy x_tables one. They keep
// separate rulesets in the kernel, so everything a process installs must use one of them.
type Mode string

const (
	ModeNFT    Mode = "nft"
	ModeLegacy Mode = "legacy"
)

// Family is an IP family; IPv4 is driven through iptables, IPv6 through ip6tables.
type Family string

const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// Families lists both families in the order the backends apply them.
var Families = []Family{IPv4, IPv6}

// LockWait is how long a restore waits for the xtables lock held by another process.
const LockWait = 10 * time.Second

// ParseMode accepts "nft", "legacy", "iptables-nft" and "iptables-legacy".
func ParseMode(s string) (Mode, error) {
	switch strings.TrimPrefix(s, "iptables-") {
	case "nft":
		return ModeNFT, nil
	case "legacy":
		return ModeLegacy, nil
	}
	return "", fmt.Errorf("iptables mode %q: want nft or legacy", s)
}

// Runner runs one variant's commands.
type Runner struct {
	Mode Mode
}

// NewRunner returns a Runner for mode after checking that its commands exist and can read the
// filter table of both families.
func NewRunner(ctx context.Context, mode Mode) (*Runner, error) {
	r := &Runner{Mode: mode}
	for _, fam := range Families {
		if _, err := r.Save(ctx, fam, "filter"); err != nil {
			return nil, fmt.Errorf("iptables-%s: %w", mode, err)
		}
	}
	return r, nil
}

// Command returns the binary name of tool ("", "-save" or "-restore") for a family, such as
// "ip6tables-legacy-restore".
func (r *Runner) Command(fam Family, tool string) string {
	base := "iptables"
	if fam == IPv6 {
		base = "ip6tables"
	}
	return base + "-" + string(r.Mode) + tool
}

// Restore applies input with `<variant>-restore --noflush`, holding the xtables lock. The input
// names the tables and chains it changes (":CHAIN - [0:0]" lines flush only those chains), so
// one call is one atomic commit per table and leaves everyone else's chains alone.
func (r *Runner) Restore(ctx context.Context, fam Family, input []byte) error {
	args := []string{"--noflush", "--wait", fmt.Sprint(int(LockWait.Seconds()))}
	_, err := run(ctx, input, r.Command(fam, "-restore"), args...)
	if err != nil {
		return fmt.Errorf("%s: %w\ninput was:\n%s", r.Command(fam, "-restore"), err, numbered(input))
	}
	return nil
}

// Save returns the rules of one table in iptables-save format.
func (r *Runner) Save(ctx context.Context, fam Family, table string) ([]byte, error) {
	return run(ctx, nil, r.Command(fam, "-save"), "-t", table)
}

// Run runs the plain iptables or ip6tables command, holding the xtables lock.
func (r *Runner) Run(ctx context.Context, fam Family, args ...string) ([]byte, error) {
	return run(ctx, nil, r.Command(fam, ""), append([]string{"--wait", fmt.Sprint(int(LockWait.Seconds()))}, args...)...)
}

// ChainExists reports whether table holds chain, for cleanup and verification paths that must
// tell "missing" apart from "broken".
func (r *Runner) ChainExists(ctx context.Context, fam Family, table, chain string) (bool, error) {
	out, err := r.Save(ctx, fam, table)
	if err != nil {
		return false, err
	}
	return bytes.Contains(out, []byte("\n:"+chain+" ")) || bytes.HasPrefix(out, []byte(":"+chain+" ")), nil
}

// IPSetRestore feeds a script of ipset commands to `ipset restore`, which applies it as one
// batch and stops at the first failing line.
func IPSetRestore(ctx context.Context, script []byte) error {
	if _, err := run(ctx, script, "ipset", "restore"); err != nil {
		return fmt.Errorf("ipset restore: %w\ninput was:\n%s", err, numbered(script))
	}
	return nil
}

// HashNetPrefixes returns the members of an ipset hash:net set that cover exactly prefix p.
// hash:net refuses a /0 ("The value of the CIDR parameter of the IP address is invalid"), so
// a whole family is its two /1 halves; any other prefix is itself.
func HashNetPrefixes(p netip.Prefix) []netip.Prefix {
	p = p.Masked()
	if p.Bits() != 0 {
		return []netip.Prefix{p}
	}
	lo := netip.PrefixFrom(p.Addr(), 1)
	hi := p.Addr().AsSlice()
	hi[0] = 0x80
	hiAddr, _ := netip.AddrFromSlice(hi)
	return []netip.Prefix{lo, netip.PrefixFrom(hiAddr, 1)}
}

// IPSetNames lists the names of every ipset in this network namespace.
func IPSetNames(ctx context.Context) ([]string, error) {
	out, err := run(ctx, nil, "ipset", "list", "-n")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// IPSetMembers lists the members of one set, as ipset prints them.
func IPSetMembers(ctx context.Context, name string) ([]string, error) {
	out, err := run(ctx, nil, "ipset", "list", name)
	if err != nil {
		return nil, err
	}
	var members []string
	inMembers := false
	for _, line := range strings.Split(string(out), "\n") {
		if inMembers {
			if line = strings.TrimSpace(line); line != "" {
				members = append(members, line)
			}
			continue
		}
		inMembers = strings.HasPrefix(line, "Members:")
	}
	return members, nil
}

func run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	return command.Run(ctx, stdin, name, args...)
}

// numbered prefixes each line with its number, because restore errors cite line numbers.
func numbered(b []byte) string {
	var sb strings.Builder
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		fmt.Fprintf(&sb, "%4d  %s\n", i+1, line)
	}
	return sb.String()
}

// DestroyIPSets destroys every ipset whose name starts with prefix: a feature's clean-up once no
// rule of any iptables variant references its sets. A host where ipset does not work holds no
// sets, so that is not an error.
func DestroyIPSets(ctx context.Context, prefix string) error {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil
	}
	names, err := IPSetNames(ctx)
	if err != nil {
		return nil
	}
	var script bytes.Buffer
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			fmt.Fprintf(&script, "destroy %s\n", n)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	return IPSetRestore(ctx, script.Bytes())
}
