package cli

import (
	"fmt"
	"io"
	"net/netip"

	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
)

// kernelDomains judges domainNames peers by the kernel's sets (explain --kernel on the
// either backend): the model cannot know which addresses the node learned from DNS. It
// remembers each lookup, so explain can name the domain and the answer behind a verdict.
// Without a kernel to ask, the peers admit nothing, and explain says why.
type kernelDomains struct {
	kc      *kernelCheck
	rs      *policy.Ruleset
	lookups []domainLookup
}

type domainLookup struct {
	pattern string
	addr    netip.Addr
	elem    nftables.LearnedElement
	err     error
}

func (d *kernelDomains) Admits(set string, addr netip.Addr) bool {
	ds := d.rs.DomainSets[set]
	if ds == nil {
		return false
	}
	l := domainLookup{pattern: ds.Pattern, addr: addr}
	switch {
	case d.kc == nil:
	case d.kc.ipt != nil:
		var e iptables.LearnedElement
		e, l.err = iptables.Learned(d.kc.ctx, set, addr)
		l.elem = nftables.LearnedElement(e)
	default:
		l.elem, l.err = nftables.Learned(d.kc.ctx, set, addr)
	}
	d.lookups = append(d.lookups, l)
	return l.elem.Held
}

// withKernelDomains returns rs judging its domainNames peers by the kernel at hand, and what
// prints the lookups the judgement made.
func withKernelDomains(rs *policy.Ruleset, kc *kernelCheck) (*policy.Ruleset, func(io.Writer)) {
	if len(rs.DomainSets) == 0 {
		return rs, func(io.Writer) {}
	}
	d := &kernelDomains{kc: kc, rs: rs}
	return rs.WithDomains(d), func(out io.Writer) {
		for _, l := range d.lookups {
			switch {
			case kc == nil:
				fmt.Fprintf(out, "           domain: the addresses of %s are learned on the node from DNS answers; run explain --kernel there to judge %s by them\n", l.pattern, l.addr)
			case l.err != nil:
				kc.mismatches++
				fmt.Fprintf(out, "           KERNEL MISMATCH: looking up %s for domain %s: %v\n", l.addr, l.pattern, l.err)
			case l.elem.Held:
				fmt.Fprintf(out, "           domain: %s is an address of %s, learned from the answer %q (expires in %s)\n", l.addr, l.pattern, l.elem.Comment, l.elem.Expires)
			default:
				fmt.Fprintf(out, "           domain: %s is no address of %s learned on this node (no answer of the cluster DNS to its pods gave it, or it expired)\n", l.addr, l.pattern)
			}
		}
		d.lookups = nil
	}
}
