package nftables

import (
	"net/netip"
)

// verdictMap returns one family's verdict map of a dispatch (pod address -> jump to its
// group's chain of that family), and notes in fams which families each group needs.
func (rd *Renderer) verdictMap(dispatch map[netip.Addr]string, v6 bool, fams map[string][2]bool, comment string) *set {
	typ, fam := "ipv4_addr : verdict", 0
	if v6 {
		typ, fam = "ipv6_addr : verdict", 1
	}
	elems := map[string]string{}
	for ip, grp := range dispatch {
		if ip.Is6() == v6 {
			elems[ip.String()] = "jump " + rd.familyChain(grp, v6)
			f := fams[grp]
			f[fam] = true
			fams[grp] = f
		}
	}
	m := newSet(typ, comment, elems)
	m.isMap = true
	return m
}

// renderGroup renders a group's chain for each family some pod of the group has (fams), into
// r, reusing prev when its content is the same. A chain jumps to the group's policy chains
// (already in r) that hold rules of its family, then ends in final. Neither an unused family's
// chain nor a jump to an empty chain judges a packet, but a change that rewrites every group
// (a policy selecting all pods) would rewrite them: in a single-stack cluster, half its work.
func (rd *Renderer) renderGroup(r *Rendered, prev renderedGroup, name string, policies []string, fams [2]bool, final []ruleSpec) renderedGroup {
	var rg renderedGroup
	for fam, v6 := range []bool{false, true} {
		if !fams[fam] {
			continue
		}
		// The jumps are compared with prev's as they are found: an unchanged group, most of
		// them, allocates nothing.
		same, n := prev.chains[fam] != nil, 0
		for _, p := range policies {
			if fc := rd.familyChain(p, v6); hasRules(r, fc) {
				same = same && n < len(prev.jumps[fam]) && prev.jumps[fam][n] == fc
				n++
			}
		}
		if same && n == len(prev.jumps[fam]) {
			rg.jumps[fam], rg.chains[fam] = prev.jumps[fam], prev.chains[fam]
		} else {
			jumps := make([]string, 0, n)
			for _, p := range policies {
				if fc := rd.familyChain(p, v6); hasRules(r, fc) {
					jumps = append(jumps, fc)
				}
			}
			specs := make([]ruleSpec, 0, len(jumps)+len(final))
			for _, j := range jumps {
				specs = append(specs, ruleSpec{jump: j})
			}
			rg.jumps[fam], rg.chains[fam] = jumps, specChain(append(specs, final...))
		}
		r.Chains[rd.familyChain(name, v6)] = rg.chains[fam]
	}
	return rg
}

func hasRules(r *Rendered, chain string) bool {
	c := r.Chains[chain]
	return c != nil && len(c.rules) > 0
}
