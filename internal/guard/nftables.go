package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	gnft "github.com/google/nftables"
	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/command"
	"github.com/netwarden/netwarden/internal/kernel/nftjson"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
)

// NFTablesTable is the guard's table, apart from the NetworkPolicy table so that its few
// rules never enter that table's diffs.
const NFTablesTable = "netwarden-guard"

// NFTables is the guard for the nftables backend.
type NFTables struct {
	// nft is made at first use (see Probe): knftables checks that nft works by running it
	// twice, which an `agent --once`, never syncing the guard, would pay for nothing while the
	// cluster state loads.
	mu      sync.Mutex
	nft     knftables.Interface
	applied *Desired
	// conn carries the known sets' changes: a pod's start waits for them, and a netlink
	// batch costs a fraction of an nft process.
	conn nftnl.Conn
}

// NewNFTables returns the guard for nftables in the network namespace of its first use.
func NewNFTables() *NFTables { return &NFTables{} }

// Probe connects to nftables and reports whether nft works here. Sync and Cleanup probe
// first; a caller that will sync later probes beforehand, beside other work. Only success is
// kept: a failure (nft busy, a transient error) is tried again at the next use.
func (g *NFTables) Probe() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.nft != nil {
		return nil
	}
	nft, err := knftables.New(knftables.InetFamily, NFTablesTable)
	if err != nil {
		return fmt.Errorf("guard: nftables: %w", err)
	}
	g.nft = nft
	return nil
}

func (g *NFTables) Name() string { return "nftables" }

func knownSet(v6 bool) string {
	if v6 {
		return "known-v6"
	}
	return "known-v4"
}

func cidrSet(v6 bool) string {
	if v6 {
		return "podcidr-v6"
	}
	return "podcidr-v4"
}

// Sync implements Guard. A change of the rules replaces the table in one transaction; a
// change of known pods only adds and removes set elements.
func (g *NFTables) Sync(ctx context.Context, d Desired) error {
	d = normalize(d)
	if sameRules(g.applied, &d) {
		add, del := diffAddrs(g.applied.Known, d.Known)
		if len(add)+len(del) == 0 {
			return nil
		}
		if err := g.applyKnown(add, del); err != nil {
			g.applied = nil
			return fmt.Errorf("guard: nftables: %w", err)
		}
		g.applied = &d
		return nil
	}
	if err := g.Probe(); err != nil {
		return err
	}
	tx := g.nft.NewTransaction()
	g.writeFull(tx, d)
	if err := command.Tracked("nft", func() error { return g.nft.Run(ctx, tx) }); err != nil {
		g.applied = nil
		return fmt.Errorf("guard: nftables: %w", err)
	}
	g.applied = &d
	return nil
}

// applyKnown removes del from and adds add to the known sets in one netlink batch.
func (g *NFTables) applyKnown(add, del []netip.Addr) error {
	table := &gnft.Table{Name: NFTablesTable, Family: gnft.TableFamilyINet}
	elems := func(addrs []netip.Addr, v6 bool) []gnft.SetElement {
		var out []gnft.SetElement
		for _, a := range addrs {
			if a.Is6() == v6 {
				out = append(out, gnft.SetElement{Key: a.AsSlice()})
			}
		}
		return out
	}
	return g.conn.Batch(func(conn *gnft.Conn) error {
		for _, v6 := range []bool{false, true} {
			set := &gnft.Set{Table: table, Name: knownSet(v6)}
			if e := elems(del, v6); len(e) > 0 {
				if err := conn.SetDeleteElements(set, e); err != nil {
					return err
				}
			}
			if e := elems(add, v6); len(e) > 0 {
				if err := conn.SetAddElements(set, e); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func (g *NFTables) writeFull(tx *knftables.Transaction, d Desired) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("netwarden guard; managed, do not edit")})
	tx.Flush(&knftables.Table{})
	for _, v6 := range []bool{false, true} {
		tx.Add(&knftables.Set{Name: knownSet(v6), Type: map[bool]string{false: "ipv4_addr", true: "ipv6_addr"}[v6]})
		tx.Add(&knftables.Set{Name: cidrSet(v6), Type: map[bool]string{false: "ipv4_addr", true: "ipv6_addr"}[v6],
			Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	}
	for _, a := range d.Known {
		tx.Add(&knftables.Element{Set: knownSet(a.Is6()), Key: []string{a.String()}})
	}
	for _, p := range d.PodCIDRs {
		tx.Add(&knftables.Element{Set: cidrSet(p.Addr().Is6()), Key: []string{p.Masked().String()}})
	}
	// Mangle priority: ahead of every filter chain, so that the NetworkPolicy table's
	// "ct state established accept" never sees a packet dropped here.
	tx.Add(&knftables.Chain{Name: "prerouting", Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.ManglePriority)})
	tx.Add(&knftables.Chain{Name: "forward", Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.ForwardHook), Priority: knftables.PtrTo(knftables.ManglePriority)})
	if d.DenyMark != 0 {
		tx.Add(&knftables.Rule{Chain: "prerouting", Rule: fmt.Sprintf("ct mark and 0x%x == 0x%x drop", d.DenyMark, d.DenyMark),
			Comment: knftables.PtrTo("an established flow a policy now denies")})
	}
	for _, v6 := range []bool{false, true} {
		if !hasFamily(d.PodCIDRs, v6) {
			continue
		}
		ip := "ip"
		if v6 {
			ip = "ip6"
		}
		tx.Add(&knftables.Rule{Chain: "prerouting", Rule: fmt.Sprintf("%s saddr @%s %s saddr != @%s drop", ip, cidrSet(v6), ip, knownSet(v6)),
			Comment: knftables.PtrTo("from a local pod without verdicts yet")})
		tx.Add(&knftables.Rule{Chain: "forward", Rule: fmt.Sprintf("%s daddr @%s %s daddr != @%s drop", ip, cidrSet(v6), ip, knownSet(v6)),
			Comment: knftables.PtrTo("to a local pod without verdicts yet")})
	}
}

func hasFamily(ps []netip.Prefix, v6 bool) bool {
	for _, p := range ps {
		if p.Addr().Is6() == v6 {
			return true
		}
	}
	return false
}

// Cleanup implements Guard.
func (g *NFTables) Cleanup(ctx context.Context) error {
	g.applied = nil
	if err := g.Probe(); err != nil {
		return err
	}
	tx := g.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := command.Tracked("nft", func() error { return g.nft.Run(ctx, tx) }); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("guard: nftables: %w", err)
	}
	return nil
}

// CleanupNFTables removes the table a guard left; nothing where nft does not work.
func CleanupNFTables(ctx context.Context) error {
	g := NewNFTables()
	if g.Probe() != nil {
		return nil
	}
	return g.Cleanup(ctx)
}

// Invalidate implements Guard.
func (g *NFTables) Invalidate() { g.applied = nil }

// Verify implements Guard: both chains with the rules applied (by count and comment), the
// known sets with exactly their addresses and the pod CIDR sets with as many prefixes, read in
// one listing of the table (it runs at every resync and on every foreign change).
func (g *NFTables) Verify(ctx context.Context) error {
	d := g.applied
	if d == nil {
		return nil
	}
	out, err := command.Run(ctx, nil, "nft", "-j", "list", "table", "inet", NFTablesTable)
	if err != nil {
		return drifted("%s", err)
	}
	l, err := nftjson.Parse(out)
	if err != nil {
		return drifted("%s", err)
	}
	want := map[string][]string{}
	for _, r := range wantRules(*d) {
		want[r[0]] = append(want[r[0]], r[1])
	}
	got := map[string][]string{}
	chains := map[string]bool{}
	elems := map[string][]json.RawMessage{}
	for _, o := range l {
		switch o.Kind {
		case "chain":
			chains[o.String("name")] = true
		case "rule":
			got[o.String("chain")] = append(got[o.String("chain")], o.String("comment"))
		case "set":
			elems[o.String("name")] = o.Elements()
		}
	}
	for _, chain := range []string{"prerouting", "forward"} {
		if !chains[chain] {
			return drifted("chain %s missing", chain)
		}
		if !slices.Equal(got[chain], want[chain]) {
			return drifted("chain %s has rules %q, want %q", chain, got[chain], want[chain])
		}
	}
	for _, v6 := range []bool{false, true} {
		wantKnown, wantCIDRs := d.members(v6)
		var gotKnown []string
		for _, e := range elems[knownSet(v6)] {
			var s string
			if json.Unmarshal(e, &s) == nil {
				gotKnown = append(gotKnown, s)
			}
		}
		slices.Sort(gotKnown)
		if !slices.Equal(gotKnown, wantKnown) {
			return drifted("set %s holds %d addresses, want %d", knownSet(v6), len(gotKnown), len(wantKnown))
		}
		if cidrs, ok := elems[cidrSet(v6)]; !ok || len(cidrs) != len(wantCIDRs) {
			return drifted("set %s holds %d prefixes, want %d", cidrSet(v6), len(cidrs), len(wantCIDRs))
		}
	}
	return nil
}

// wantRules are the comments of the rules writeFull puts in each chain, in order.
func wantRules(d Desired) [][2]string {
	var out [][2]string
	if d.DenyMark != 0 {
		out = append(out, [2]string{"prerouting", "an established flow a policy now denies"})
	}
	for _, v6 := range []bool{false, true} {
		if hasFamily(d.PodCIDRs, v6) {
			out = append(out, [2]string{"prerouting", "from a local pod without verdicts yet"}, [2]string{"forward", "to a local pod without verdicts yet"})
		}
	}
	return out
}

// KernelTables implements dataplane.KernelTables.
func (g *NFTables) KernelTables() []dataplane.KernelTable {
	return []dataplane.KernelTable{{Family: "inet", Name: NFTablesTable}}
}
