package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/policy"
)

// Expectation is one fact of the kernel a verdict of the model depends on: which group chain
// a dispatch tree leads a local pod's address to, or whether a pod ipset holds an address.
type Expectation struct {
	// Root is the dispatch tree's root chain, or the ipset's name.
	Root string
	Addr netip.Addr
	// Want is the group chain the tree must lead Addr to by goto, "" when it must lead Addr
	// to none of the kind (prefix names the kind: the NetworkPolicy/Baseline tree is shared,
	// so "leads to no NetworkPolicy group" must not object to a Baseline group); for a set,
	// "member" or "".
	Want   string
	prefix string
	isSet  bool
	// rules, for a dispatch fact, are the wanted group chain's rules. Group names depend on the
	// agent's history of changes (see policy.groupNamer), what a group does does not: a tree
	// that leads Addr to another group chain of the kind with the same rules holds the fact.
	rules func() []string
}

func (e Expectation) String() string {
	switch {
	case !e.isSet && e.Want != "":
		return fmt.Sprintf("chain %s leads %s to %s", e.Root, e.Addr, e.Want)
	case !e.isSet:
		return fmt.Sprintf("chain %s leads %s to no %s* chain", e.Root, e.Addr, e.prefix)
	case e.Want != "":
		return fmt.Sprintf("ipset %s holds %s", e.Root, e.Addr)
	}
	return fmt.Sprintf("ipset %s does not hold %s", e.Root, e.Addr)
}

// Expectations is nftables.Expectations for this backend: what the verdict of direction dir
// for local pod address local towards peer depends on in the kernel of local's node. The
// Admin tier has its own dispatch tree; NetworkPolicy and the Baseline tier share one, in
// which an address isolated by NetworkPolicy never leads to a Baseline group (see
// Rendered.dispatch).
func Expectations(rs *policy.Ruleset, dir policy.Direction, local, peer netip.Addr) []Expectation {
	stages := rs.StageGroups(dir, local)
	judging := stages[:]
	if stages[policy.NetworkPolicyStage].Group != "" {
		// The Baseline fact of an isolated pod would only repeat the NetworkPolicy one: the
		// address leads to its NetworkPolicy group, so to no Baseline group.
		judging = stages[:policy.BaselineStage]
	}
	fam := famOf(local)
	rendered := sync.OnceValue(func() *Rendered { return Render(rs) })
	var out []Expectation
	for _, st := range judging {
		root, prefix, chain := stageChains(st.Stage, dir)
		e := Expectation{Root: root, Addr: local, prefix: prefix}
		if st.Group != "" {
			name := chain(st.Group)
			e.Want = name
			e.rules = func() []string { return rendered().Chains[fam][name] }
		}
		out = append(out, e)
	}
	for _, set := range rs.PeerSets(judging...) {
		e := Expectation{Root: podSet(set, fam), Addr: peer, isSet: true}
		if rs.AddrSets[set].Holds(peer) {
			e.Want = "member"
		}
		out = append(out, e)
	}
	return out
}

// stageChains returns the root of a stage's dispatch tree in direction dir, the prefix of its
// group chains' names, and what names one.
func stageChains(stage policy.Stage, dir policy.Direction) (root, prefix string, chain func(group string) string) {
	switch stage {
	case policy.AdminStage:
		return adminRoot(dir), adminGroupPrefix, adminChain
	case policy.NetworkPolicyStage:
		return npRoot(dir), groupPrefix, groupChain
	}
	return npRoot(dir), baselineGroupPrefix, baselineChain
}

// Programmed returns a runner for the iptables variant whose mangle table holds our chains
// in either family, or nil when neither does (or neither works here).
func Programmed(ctx context.Context) *xtables.Runner {
	for _, m := range []xtables.Mode{xtables.ModeNFT, xtables.ModeLegacy} {
		r, err := xtables.NewRunner(ctx, m)
		if err != nil {
			continue
		}
		for _, f := range families {
			if ok, err := r.ChainExists(ctx, f, Table, chainForward); err == nil && ok {
				return r
			}
		}
	}
	return nil
}

// Check looks each expectation up in the kernel of run's variant (in the caller's network
// namespace) and returns a line for each that does not hold. Each family's mangle table and
// the ipsets are read once, whatever the number of facts.
func Check(ctx context.Context, run *xtables.Runner, exps []Expectation) ([]string, error) {
	var tables [2]*saved
	table := func(fam int) (*saved, error) {
		if tables[fam] == nil {
			out, err := run.Save(ctx, families[fam], Table)
			if err != nil {
				return nil, err
			}
			st := parseSave(out)
			if _, ok := st.rules[chainForward]; !ok {
				return nil, fmt.Errorf("the %s %s table of iptables-%s holds no %s (is the agent running here, on the iptables backend?)",
					families[fam], Table, run.Mode, chainForward)
			}
			tables[fam] = &st
		}
		return tables[fam], nil
	}
	var sets map[string][]string
	var bad []string
	for _, e := range exps {
		if e.isSet {
			if sets == nil {
				out, err := exec.CommandContext(ctx, "ipset", "save").Output()
				if err != nil {
					return nil, fmt.Errorf("ipset save: %w", err)
				}
				sets = parseIPSetSave(out)
			}
			members, exists := sets[e.Root]
			held := slices.ContainsFunc(members, func(m string) bool {
				a, err := netip.ParseAddr(m)
				return err == nil && a == e.Addr
			})
			switch {
			case !exists:
				bad = append(bad, fmt.Sprintf("want: %s; kernel: there is no ipset %s", e, e.Root))
			case e.Want != "" && !held:
				bad = append(bad, fmt.Sprintf("want: %s; kernel: it does not", e))
			case e.Want == "" && held:
				bad = append(bad, fmt.Sprintf("want: %s; kernel: it holds it", e))
			}
			continue
		}
		st, err := table(famOf(e.Addr))
		if err != nil {
			return nil, err
		}
		if b := checkDispatch(st, e); b != "" {
			bad = append(bad, b)
		}
	}
	return bad, nil
}

// checkDispatch holds a dispatch expectation against one family's saved filter table and
// returns what does not hold, or "".
func checkDispatch(st *saved, e Expectation) string {
	got, path := lead(st, e.Root, e.Addr)
	switch {
	case e.Want != "" && got == "":
		return fmt.Sprintf("want: %s; kernel: %s leads it to no group chain%s", e, e.Root, via(path))
	case e.Want != "" && got != e.Want && !(strings.HasPrefix(got, e.prefix) && e.rules != nil && slices.Equal(judging(st.rules[got]), judging(e.rules()))):
		return fmt.Sprintf("want: %s; kernel: it leads it to %s%s, whose rules differ", e, got, via(path))
	case e.Want == "" && strings.HasPrefix(got, e.prefix):
		return fmt.Sprintf("want: %s; kernel: it leads it to %s%s", e, got, via(path))
	}
	return ""
}

// judging leaves out of a chain's rules those that only log (--log-drops), whose prefix names
// the group: explain renders without them, and they decide nothing.
func judging(rules []string) []string {
	return slices.DeleteFunc(slices.Clone(rules), func(r string) bool { return strings.Contains(r, "-j NFLOG") })
}

func via(path []string) string {
	if len(path) < 2 {
		return ""
	}
	return " (via " + strings.Join(path[1:], ", ") + ")"
}

// lead follows addr through the dispatch tree at root as the kernel does: the first rule whose
// address match holds decides, a block chain is entered, and a group chain (or the end, or
// a rule matching every address, such as the Admin tree's goto to the NetworkPolicy tree) ends
// the walk. It returns the group chain reached, or "", and the chains crossed.
func lead(st *saved, root string, addr netip.Addr) (string, []string) {
	chain, path := root, []string{root}
	for depth := 0; depth < 4; depth++ {
		next := ""
		for _, spec := range st.rules[chain] {
			d, ok := parseDispatchRule(spec)
			if !ok {
				if strings.HasPrefix(spec, "-g ") {
					return "", path // a goto for every address: out of this tree
				}
				continue
			}
			if d.prefix.Contains(addr) {
				next = strings.Fields(spec)[3]
				break
			}
		}
		if next == "" {
			return "", path
		}
		if strings.HasPrefix(next, groupPrefix) || strings.HasPrefix(next, adminGroupPrefix) || strings.HasPrefix(next, baselineGroupPrefix) {
			return next, path
		}
		chain, path = next, append(path, next)
	}
	return "", path
}
