package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/netwarden/netwarden/internal/policy"
)

type dispatchLeaf struct {
	ip    netip.Addr
	chain string
}

// dispatchTree writes the dispatch chain of one direction and family, a two-level tree: one
// rule per occupied block of 16 addresses ("-s <block> -g <block chain>", or straight to the
// group when the block holds one pod), and in each block chain one rule per pod ("-s IP -g
// group"). A node's pods come from its pod CIDR, so a packet crosses a few dozen cheap address
// compares at most. The blocks are fixed by the addresses, not by which pods exist, so a pod
// added or removed rewrites its block's chain and at most the root. Entries are sorted.
//
// cont, when set, is the rule that ends the root and every block chain: where an address that
// no rule leads to a group goes on (the Admin tree's "-g NETWARDEN-EGRESS"). Without it such
// an address falls off the end, which allows it.
func (r *Rendered) dispatchTree(fam int, root, kind, flag string, leaves []dispatchLeaf, cont string) {
	bits := addrBits(fam)
	rule := func(p netip.Prefix, target string) string { return fmt.Sprintf("%s %s -g %s", flag, p, target) }
	rules := []string{}
	for start := 0; start < len(leaves); {
		block := netip.PrefixFrom(leaves[start].ip, bits-4).Masked()
		end := start + 1
		for end < len(leaves) && block.Contains(leaves[end].ip) {
			end++
		}
		if end-start == 1 {
			rules = append(rules, rule(netip.PrefixFrom(leaves[start].ip, bits), leaves[start].chain))
		} else {
			child := r.name(dispatchChain(kind, block), kind+" "+block.String())
			rules = append(rules, rule(block, child))
			inner := make([]string, 0, end-start+1)
			for _, l := range leaves[start:end] {
				inner = append(inner, rule(netip.PrefixFrom(l.ip, bits), l.chain))
			}
			if cont != "" {
				inner = append(inner, cont)
			}
			r.Chains[fam][child] = inner
		}
		start = end
	}
	if cont != "" {
		rules = append(rules, cont)
	}
	r.Chains[fam][root] = rules
}

// tierDirection records that a tier group is dispatched in dir; one group in both
// directions is a render error.
func (r *Rendered) tierDirection(dirs map[string]policy.Direction, grp string, dir policy.Direction) {
	if d, ok := dirs[grp]; ok && d != dir {
		r.fail(fmt.Errorf("tier group %s is dispatched for both %s and %s", grp, d, dir))
	}
	dirs[grp] = dir
}

func markUsed(used map[string][2]bool, grp string, fam int) {
	u := used[grp]
	u[fam] = true
	used[grp] = u
}

func sortLeaves(leaves []dispatchLeaf) {
	sort.Slice(leaves, func(a, b int) bool { return leaves[a].ip.Less(leaves[b].ip) })
}

// dispatched is what the dispatch trees lead to: which families each group has pods in (a
// group chain exists only where a dispatch rule leads to it), the direction each tier group
// is dispatched in (which its chain must judge), and the chain each direction's judgement
// starts at, per family.
type dispatched struct {
	used, usedAdmin, usedBaseline map[string][2]bool
	groupDirs                     map[string]policy.Direction // of the NetworkPolicy groups
	tierDirs                      map[policy.TierName]map[string]policy.Direction
	entry                         map[policy.Direction][2]string
}

// dispatch writes the dispatch trees of both directions and families. The Admin tier has a
// root of its own in each direction and family where it has pods, and the built-in chains
// jump there instead.
func (r *Rendered) dispatch(rs *policy.Ruleset) dispatched {
	d := dispatched{
		used: map[string][2]bool{}, usedAdmin: map[string][2]bool{}, usedBaseline: map[string][2]bool{},
		groupDirs: map[string]policy.Direction{},
		tierDirs:  map[policy.TierName]map[string]policy.Direction{policy.AdminTier: {}, policy.BaselineTier: {}},
		entry:     map[policy.Direction][2]string{},
	}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		kind, flag := "I", "-d"
		if dir == policy.Egress {
			kind, flag = "E", "-s"
		}
		var leaves, admin [2][]dispatchLeaf
		for ip, grp := range rs.Dispatch[dir] {
			fam := famOf(ip)
			leaves[fam] = append(leaves[fam], dispatchLeaf{ip: ip, chain: r.name(groupChain(grp), grp)})
			markUsed(d.used, grp, fam)
			d.groupDirs[grp] = dir
		}
		// The Baseline tier judges only pods that NetworkPolicy does not isolate, so its
		// groups share the NetworkPolicy tree: an address leads to one or the other.
		for ip, grp := range rs.Baseline.Dispatch[dir] {
			if _, isolated := rs.Dispatch[dir][ip]; isolated {
				continue
			}
			fam := famOf(ip)
			leaves[fam] = append(leaves[fam], dispatchLeaf{ip: ip, chain: r.name(baselineChain(grp), "baseline "+grp)})
			markUsed(d.usedBaseline, grp, fam)
			r.tierDirection(d.tierDirs[policy.BaselineTier], grp, dir)
		}
		for ip, grp := range rs.Admin.Dispatch[dir] {
			fam := famOf(ip)
			admin[fam] = append(admin[fam], dispatchLeaf{ip: ip, chain: r.name(adminChain(grp), "admin "+grp)})
			markUsed(d.usedAdmin, grp, fam)
			r.tierDirection(d.tierDirs[policy.AdminTier], grp, dir)
		}
		var e [2]string
		for fam := range leaves {
			sortLeaves(leaves[fam])
			r.dispatchTree(fam, npRoot(dir), kind+famDigit(fam), flag, leaves[fam], "")
			e[fam] = npRoot(dir)
			if len(admin[fam]) > 0 {
				sortLeaves(admin[fam])
				r.dispatchTree(fam, adminRoot(dir), "A"+kind+famDigit(fam), flag, admin[fam], "-g "+npRoot(dir))
				e[fam] = adminRoot(dir)
			}
		}
		d.entry[dir] = e
	}
	return d
}

var ndTypes = []int{133, 134, 135, 136, 137} // router solicit/advert, neighbor solicit/advert, redirect

// hookChains writes, per family, the chains the built-in chains jump to; entry holds where
// each direction's judgement starts. With staged policies, a new connection a direction allows
// is judged again after it (see staged.go).
func (r *Rendered) hookChains(entry map[policy.Direction][2]string, staged bool) {
	for fam := range r.Chains {
		prelude := []string{"-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"}
		if fam == v6 {
			for _, t := range ndTypes {
				prelude = append(prelude, fmt.Sprintf("-p ipv6-icmp -m icmp6 --icmpv6-type %d -j RETURN", t))
			}
		}
		// Egress is judged on every packet from a pod, forwarded or delivered to the node;
		// the filter table sees it after DNAT, so a Service address is already its endpoint.
		judge := func(dir policy.Direction) []string {
			rules := []string{"-j " + entry[dir][fam]}
			if staged {
				rules = append(rules, "-m conntrack --ctstate NEW -j "+stagedRoot(afterAccept, dir))
			}
			return rules
		}
		r.Chains[fam][chainForward] = slices.Concat(prelude, judge(policy.Egress), judge(policy.Ingress))
		r.Chains[fam][chainInput] = slices.Concat(prelude, judge(policy.Egress))
	}
}
