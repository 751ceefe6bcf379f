// Package guard keeps the few rules that judge packets ahead of the NetworkPolicy rules, in
// a table (nftables) or chains (iptables mangle) of their own so that neither backend's
// renderer needs to know about them:
//
//   - the packets of every conntrack entry whose mark has the deny bit are dropped, in both
//     directions: the agent sets the bit on the established flows a new policy denies (see
//     agent.establishedPass for why a mark and not a delete);
//   - with pod CIDRs given (the gate is on), a packet from or to an address of this node's pod
//     CIDRs that the agent has no verdicts for is dropped: a pod is judged from its first
//     packet, never let through because its rules are not there yet.
package guard

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/netwarden/netwarden/internal/dataplane"
)

// Desired is what the guard enforces.
type Desired struct {
	// DenyMark is the conntrack mark bit of denied flows; 0 installs no such rule.
	DenyMark uint32
	// PodCIDRs are this node's pod CIDRs; empty installs no rule about unknown pods.
	PodCIDRs []netip.Prefix
	// Known are the local pod addresses whose verdicts the kernel holds.
	Known []netip.Addr
}

// Guard programs a Desired into the kernel.
type Guard interface {
	Name() string
	// Sync makes the kernel hold d, replacing what an earlier run left.
	Sync(ctx context.Context, d Desired) error
	// Cleanup removes everything the guard installed; absent rules are not an error.
	Cleanup(ctx context.Context) error
	// Verify reports how the kernel differs from what the last Sync applied (nil when it
	// holds it, or when nothing was applied yet).
	Verify(ctx context.Context) error
	// Invalidate makes the next Sync rewrite everything: for a repair of the guard's rules,
	// or of the rules beside them (whoever changed those may have changed the guard's too).
	Invalidate()
}

// Prober is a guard that can check, ahead of its first Sync, that it works here, so that the
// check runs beside the agent's start rather than in its first sync.
type Prober interface {
	Probe() error
}

// The capabilities the agent finds by type assertion.
var (
	_ Guard                  = (*NFTables)(nil)
	_ Guard                  = (*IPTables)(nil)
	_ Prober                 = (*NFTables)(nil)
	_ dataplane.KernelTables = (*NFTables)(nil)
	_ dataplane.KernelTables = (*IPTables)(nil)
)

// Drift is what Verify returns when someone else changed or removed the guard's rules.
type Drift struct{ Reason string }

func (d *Drift) Error() string { return "guard drifted: " + d.Reason }

func drifted(format string, args ...any) error { return &Drift{Reason: fmt.Sprintf(format, args...)} }

func sameRules(a, b *Desired) bool {
	return a != nil && b != nil && a.DenyMark == b.DenyMark && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}

// diffAddrs returns what to add to and remove from old to get new (both sorted).
func diffAddrs(old, cur []netip.Addr) (add, del []netip.Addr) {
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		switch {
		case i == len(old):
			add = append(add, cur[j])
			j++
		case j == len(cur):
			del = append(del, old[i])
			i++
		default:
			switch c := old[i].Compare(cur[j]); {
			case c == 0:
				i++
				j++
			case c < 0:
				del = append(del, old[i])
				i++
			default:
				add = append(add, cur[j])
				j++
			}
		}
	}
	return add, del
}

// members are the addresses and prefixes of one family the guard's sets hold for d, sorted
// as strings (how Verify compares them with a listing).
func (d *Desired) members(v6 bool) (known, cidrs []string) {
	for _, a := range d.Known {
		if a.Is6() == v6 {
			known = append(known, a.String())
		}
	}
	for _, p := range d.PodCIDRs {
		if p.Addr().Is6() == v6 {
			cidrs = append(cidrs, p.Masked().String())
		}
	}
	slices.Sort(known)
	slices.Sort(cidrs)
	return known, cidrs
}

// normalize sorts and deduplicates the addresses of d.
func normalize(d Desired) Desired {
	d.Known = slices.Clone(d.Known)
	slices.SortFunc(d.Known, netip.Addr.Compare)
	d.Known = slices.Compact(d.Known)
	return d
}
