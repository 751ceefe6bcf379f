package iptables

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// plan is the difference between two renderings.
type plan struct {
	setsBefore []byte // creates and additions, before any rule uses them
	setsAfter  []byte // deletions and destroys, once no rule needs them
	// Per family: chains created or rewritten whole, chains removed, and rule edits
	// (-I, -R, -D lines) of chains that exist on both sides.
	chains [2]struct{ write, gone, edits []string }
	ops    int
}

func (p *plan) empty() bool { return p.ops == 0 }

// removes reports whether the plan deletes a rule, chain or set: with iptables-nft, a restore
// that does waits out an RCU grace period as it exits. Set members leaving a set do not count:
// ipset deletes them without that wait.
func (p *plan) removes() bool {
	for _, c := range p.chains {
		if len(c.gone) > 0 {
			return true
		}
		for _, e := range c.edits {
			if !strings.HasPrefix(e, "-I ") {
				return true
			}
		}
	}
	return bytes.Contains(p.setsAfter, []byte("destroy "))
}

func (p *plan) operations() int { return p.ops }

// diff computes the plan that turns old into new. Members join a set before the rules that
// need them and leave it after, so a pod moving between groups is judged by the old group or
// the new one at every instant, never by none.
func diff(old, new *Rendered) *plan {
	p := &plan{}
	var before, after bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(new.Sets)) {
		s, o := new.Sets[name], old.Sets[name]
		if s == o {
			continue
		}
		if o == nil || o.typ != s.typ || o.v6 != s.v6 {
			if o != nil {
				// Same name, different kind: cannot happen with hashed names of one kind.
				fmt.Fprintf(&after, "destroy %s\n", name)
			}
			before.WriteString(s.createLine(name) + "\n")
			p.ops++
			for _, m := range s.Keys() {
				fmt.Fprintf(&before, "add %s %s\n", name, m)
				p.ops++
			}
			continue
		}
		added, removed := s.Changes(&o.Content)
		for _, m := range added {
			fmt.Fprintf(&before, "add %s %s -exist\n", name, m)
		}
		for _, m := range removed {
			fmt.Fprintf(&after, "del %s %s -exist\n", name, m)
		}
		p.ops += len(added) + len(removed)
	}
	for fam := range new.Chains {
		for _, name := range slices.Sorted(maps.Keys(new.Chains[fam])) {
			o, ok := old.Chains[fam][name]
			n := new.Chains[fam][name]
			if ok && slices.Equal(o, n) {
				continue
			}
			if ok {
				edits := chainEdits(name, o, n)
				p.chains[fam].edits = append(p.chains[fam].edits, edits...)
				p.ops += len(edits)
				continue
			}
			p.chains[fam].write = append(p.chains[fam].write, name)
			p.ops += 1 + len(n)
		}
		for _, name := range slices.Sorted(maps.Keys(old.Chains[fam])) {
			if _, ok := new.Chains[fam][name]; !ok {
				p.chains[fam].gone = append(p.chains[fam].gone, name)
				p.ops += 2
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(old.Sets)) {
		if new.Sets[name] == nil {
			fmt.Fprintf(&after, "destroy %s\n", name)
			p.ops++
		}
	}
	p.setsBefore, p.setsAfter = before.Bytes(), after.Bytes()
	return p
}
