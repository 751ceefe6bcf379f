package iptables

import (
	"fmt"
	"net/netip"
	"strings"
)

// Deferred removal.
//
// With iptables-nft every restore that deletes a rule or a chain waits out an RCU grace period
// as the process exits (11-25 ms here; see chainEdits), and so does the next ipset process,
// because any nfnetlink socket that closes while nf_tables has deletions pending waits for
// them. Most changes delete only what no packet can reach any more: the group chain that a pod
// left, the dispatch rule that sent it there. Such a change is applied as additions alone, and
// the removals follow in one compaction when the node is idle (Backend.Compact):
//
//   - chains and sets that the new rendering no longer has stay, unreferenced or referenced
//     only from shadowed rules;
//   - in a dispatch chain, a rule that is replaced or removed stays where it is, and the new
//     rules are inserted in front of it. A removed rule gets a "-j RETURN" for its prefix in
//     front of it, so its addresses are no longer isolated; in the Admin tier's chains, whose
//     last rule goes on to the NetworkPolicy stage ("-g NETWARDEN-EGRESS"), it gets that goto
//     for its prefix instead. Dispatch rules are first-match final (-g to a chain that decides,
//     or RETURN), so the kernel judges every packet exactly as the new rendering would.
//
// Set members still leave their sets at once: a member is looked up by live rules. A change
// that edits any other chain in place by more than insertions (a group's rules, or the jump of
// NETWARDEN-FORWARD/-INPUT that moves to the Admin tier's root when a family gets its first
// Admin pod, and back after its last) is applied with its removals at once.

// withDeferredRemovals returns what the kernel holds when want is applied to kernel (the
// previous rendering, without deferred removals of its own) by additions only, as described
// above.
func withDeferredRemovals(kernel, want *Rendered) *Rendered {
	out := &Rendered{
		Sets:          make(map[string]*ipset, len(want.Sets)),
		Sources:       want.Sources,
		GroupPolicies: want.GroupPolicies,
	}
	for name, s := range want.Sets {
		out.Sets[name] = s
	}
	for name, s := range kernel.Sets {
		if _, ok := out.Sets[name]; !ok {
			out.Sets[name] = s
		}
	}
	for fam := range want.Chains {
		chains := make(map[string][]string, len(want.Chains[fam]))
		for name, rules := range want.Chains[fam] {
			old, ok := kernel.Chains[fam][name]
			if ok && isDispatchChain(name) {
				rules = shadowMerge(old, rules)
			}
			chains[name] = rules
		}
		for name, rules := range kernel.Chains[fam] {
			if _, ok := chains[name]; !ok {
				chains[name] = rules
			}
		}
		out.Chains[fam] = chains
	}
	return out
}

func isDispatchChain(name string) bool {
	switch name {
	case chainEgress, chainIngress, chainAdminEgress, chainAdminIngress:
		return true
	}
	for _, kind := range []string{"E4-", "E6-", "I4-", "I6-", "AE4-", "AE6-", "AI4-", "AI6-"} {
		if strings.HasPrefix(name, ChainPrefix+kind) {
			return true
		}
	}
	return false
}

// dispatchRule is a rule of a dispatch chain: "-s|-d <prefix> -g <chain>".
type dispatchRule struct {
	text   string
	flag   string
	prefix netip.Prefix
}

func parseDispatchRule(rule string) (dispatchRule, bool) {
	f := strings.Fields(rule)
	if len(f) != 4 || (f[0] != "-s" && f[0] != "-d") || f[2] != "-g" {
		return dispatchRule{}, false
	}
	p, err := netip.ParsePrefix(f[1])
	if err != nil {
		return dispatchRule{}, false
	}
	return dispatchRule{text: rule, flag: f[0], prefix: p}, true
}

// shadowMerge returns old with want's new rules inserted, so that the first rule matching any
// address is want's rule for it, or else what the chain does with an address no rule leads
// anywhere: a RETURN, or the chain's continuation (its last rule, "-g CHAIN") when it has one.
// old must be a clean rendering: rules sorted by address with disjoint prefixes, as want's are.
// When a rule is not of the dispatch form, or the continuations differ, it returns want, and
// the change is applied with removals.
func shadowMerge(old, want []string) []string {
	oldCont, oldBody := splitContinuation(old)
	wantCont, wantBody := splitContinuation(want)
	if oldCont != wantCont {
		return want
	}
	fall := "-j RETURN"
	if wantCont != "" {
		fall = wantCont
	}
	out, ok := shadowMergeBody(oldBody, wantBody, fall)
	if !ok {
		return want
	}
	if wantCont != "" {
		out = append(out, wantCont)
	}
	return out
}

// splitContinuation cuts a dispatch chain's continuation, a last rule "-g CHAIN" that matches
// every packet, from its rules.
func splitContinuation(rules []string) (cont string, body []string) {
	if n := len(rules); n > 0 {
		if f := strings.Fields(rules[n-1]); len(f) == 2 && f[0] == "-g" {
			return rules[n-1], rules[:n-1]
		}
	}
	return "", rules
}

// shadowMergeBody merges dispatch rules as shadowMerge says; fall is the target that sends an
// address on as no rule of the chain matched it.
func shadowMergeBody(old, want []string, fall string) ([]string, bool) {
	inWant := make(map[string]bool, len(want))
	for _, r := range want {
		inWant[r] = true
	}
	inOld := make(map[string]bool, len(old))
	// units are old's rules in order, a removed one preceded by its shadow.
	type unit struct {
		rule  dispatchRule
		lines []string
	}
	units := make([]unit, 0, len(old))
	for _, r := range old {
		d, ok := parseDispatchRule(r)
		if !ok {
			return nil, false
		}
		inOld[r] = true
		u := unit{rule: d, lines: []string{r}}
		if !inWant[r] {
			u.lines = []string{fmt.Sprintf("%s %s %s", d.flag, d.prefix, fall), r}
		}
		units = append(units, u)
	}
	out := make([]string, 0, len(old)+len(want)+4)
	next := 0
	for _, r := range want {
		if inOld[r] {
			// A kept rule: everything of old before it comes first, as it did.
			for next < len(units) {
				u := units[next]
				next++
				out = append(out, u.lines...)
				if u.rule.text == r {
					break
				}
			}
			continue
		}
		w, ok := parseDispatchRule(r)
		if !ok {
			return nil, false
		}
		// A new rule goes in front of the first old rule that overlaps it or starts after it.
		for next < len(units) {
			u := units[next].rule
			if u.prefix.Overlaps(w.prefix) || w.prefix.Addr().Less(u.prefix.Addr()) {
				break
			}
			out = append(out, units[next].lines...)
			next++
		}
		out = append(out, r)
	}
	for ; next < len(units); next++ {
		out = append(out, units[next].lines...)
	}
	return out, true
}

// subsequenceEdits returns the -I lines that turn old into new when old is a subsequence of
// new, or the -D lines when new is a subsequence of old; ok is false otherwise.
func subsequenceEdits(chain string, old, new []string) (edits []string, ok bool) {
	if len(old) <= len(new) {
		j := 0
		for i, r := range new {
			if j < len(old) && old[j] == r {
				j++
				continue
			}
			edits = append(edits, fmt.Sprintf("-I %s %d %s", chain, i+1, r))
		}
		return edits, j == len(old)
	}
	j := 0
	kept := 0
	for _, r := range old {
		if j < len(new) && new[j] == r {
			j++
			kept++
			continue
		}
		// Rules before this one are new's first kept rules, so its position is kept+1.
		edits = append(edits, fmt.Sprintf("-D %s %d", chain, kept+1))
	}
	return edits, j == len(new)
}
