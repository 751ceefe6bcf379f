package masquerade

import (
	"github.com/netwarden/netwarden/internal/kernel/netipx"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// Options are the agent's masquerade flags: what the config file cannot say.
type Options struct {
	// ExtraNonMasqueradeCIDRs come from --no-masquerade-cidr and add to the file's list.
	ExtraNonMasqueradeCIDRs []netip.Prefix
	// AllReservedRanges is --nomasq-all-reserved-ranges: the reserved IPv4 ranges join the
	// default list (only when the file does not give its own list, as in ip-masq-agent).
	AllReservedRanges bool
	// RandomFully is --random-fully: fully randomised source ports, so that many pods behind
	// one node address do not race for the same port.
	RandomFully bool
	// AllSources is --masquerade-all-sources: masquerade every source, not only this node's
	// pods (for pod networks whose addresses are not the nodes' podCIDRs).
	AllSources bool
}

// Desired is the complete masquerade state of one node. Sets are disjoint, sorted ranges: a
// CIDR inside another adds nothing (a new Node inside 10.0.0.0/8 changes nothing), and
// overlapping CIDRs become one range. Adjacent ranges are kept apart on purpose: merging them
// would turn the addition of a Node next to another into the deletion of an element, a
// bigger transaction (and, for any tool that closes its netlink socket after it, an RCU grace
// period; see nftnl.Conn) for no change in behaviour.
type Desired struct {
	RandomFully bool
	// Sources are the addresses whose traffic may be masqueraded; NoMasquerade the destinations
	// that keep the pod's address. Index 0 is IPv4, 1 is IPv6.
	Sources      [2][]Range
	NoMasquerade [2][]Range
}

// Range is an inclusive range of addresses of one family.
type Range struct{ First, Last netip.Addr }

// Equal reports whether two desired states program the same rules.
func (d *Desired) Equal(o *Desired) bool {
	return d.RandomFully == o.RandomFully &&
		slices.Equal(d.Sources[0], o.Sources[0]) && slices.Equal(d.Sources[1], o.Sources[1]) &&
		slices.Equal(d.NoMasquerade[0], o.NoMasquerade[0]) && slices.Equal(d.NoMasquerade[1], o.NoMasquerade[1])
}

// Compute derives the desired state from the config, the flags and the cluster's Nodes.
// Every Node's podCIDRs are non-masquerade destinations (pod-to-pod keeps its address across
// nodes); this node's podCIDRs are the sources. A Node whose podCIDRs do not parse is skipped
// here: the sources validate Nodes before they reach the state.
func Compute(cfg Config, opts Options, nodes map[string]*corev1.Node, nodeName string) *Desired {
	d := &Desired{RandomFully: opts.RandomFully}
	var noMasq, sources []netip.Prefix
	noMasq = append(noMasq, cfg.NonMasqueradeCIDRs...)
	noMasq = append(noMasq, opts.ExtraNonMasqueradeCIDRs...)
	if !cfg.MasqLinkLocal {
		noMasq = append(noMasq, LinkLocalV4)
	}
	if !cfg.MasqLinkLocalIPv6 {
		noMasq = append(noMasq, LinkLocalV6)
	}
	for name, n := range nodes {
		for _, s := range n.Spec.PodCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				continue
			}
			p = p.Masked()
			noMasq = append(noMasq, p)
			if name == nodeName {
				sources = append(sources, p)
			}
		}
	}
	if opts.AllSources {
		sources = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	}
	for fam := range 2 {
		d.NoMasquerade[fam] = mergeRanges(noMasq, fam == 1, false)
		d.Sources[fam] = mergeRanges(sources, fam == 1, false)
	}
	return d
}

// LocalPodCIDRs returns this node's podCIDRs, to warn when there are none: without them (and
// without --masquerade-all-sources) nothing is masqueraded.
func LocalPodCIDRs(nodes map[string]*corev1.Node, nodeName string) []string {
	if n := nodes[nodeName]; n != nil {
		return n.Spec.PodCIDRs
	}
	return nil
}

// mergeRanges returns the union of the prefixes of one family as sorted, disjoint ranges;
// adjacent ones are merged too when adjacent is set, which makes the result the one canonical
// form of an address set (to compare what the kernel lists with what we sent).
func mergeRanges(prefixes []netip.Prefix, ipv6, adjacent bool) []Range {
	var rs []Range
	for _, p := range prefixes {
		if p.Addr().Is6() != ipv6 || p.Addr().Is4In6() {
			continue
		}
		rs = append(rs, prefixRange(p))
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].First.Less(rs[j].First) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			limit := last.Last // overlapping: r starts at or before our end
			if adjacent {
				limit = last.Last.Next()
			}
			if !limit.IsValid() || r.First.Compare(limit) <= 0 {
				if r.Last.Compare(last.Last) > 0 {
					last.Last = r.Last
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	return Range{First: p.Addr(), Last: netipx.LastAddr(p)}
}

// Prefixes splits r into the fewest prefixes that cover exactly r, for set types that hold
// prefixes only. A whole family is one /0 (ipset hash:net needs it split: see
// xtables.HashNetPrefixes).
func (r Range) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	first := r.First
	for {
		// The largest prefix that starts at first and does not pass r.Last.
		bits := first.BitLen()
		for bits > 0 {
			p := netip.PrefixFrom(first, bits-1)
			if p.Masked().Addr() != first || prefixRange(p).Last.Compare(r.Last) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(first, bits)
		out = append(out, p)
		end := prefixRange(p).Last
		if end.Compare(r.Last) >= 0 {
			return out
		}
		first = end.Next()
	}
}

// String is the range as nftables writes an interval element: a prefix when it is one.
func (r Range) String() string {
	if ps := r.Prefixes(); len(ps) == 1 {
		return ps[0].String()
	}
	return r.First.String() + "-" + r.Last.String()
}
