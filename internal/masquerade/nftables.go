package masquerade

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	gnft "github.com/google/nftables"
	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/command"
	"github.com/netwarden/netwarden/internal/kernel/nftjson"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
)

// NFTablesTable is the masquerade table, separate from the NetworkPolicy table so that either
// feature can be turned off alone.
const NFTablesTable = "netwarden-masq"

const nftChain = "postrouting"

// NFTables is the nftables backend: table inet netwarden-masq with one nat chain at
// postrouting and four interval sets. Its three rules never change with the configuration:
// every change is set elements, one transaction.
type NFTables struct {
	nft knftables.Interface
	// applied is what the kernel held after our last successful transaction; nil forces the
	// next sync to replace the table.
	applied *Desired
	// rules is the chain as the kernel listed it after our last sync, to see in-place edits.
	rules []string
	// conn carries incremental element changes.
	conn nftnl.Conn
}

// NewNFTables connects to nftables in the current network namespace.
func NewNFTables() (*NFTables, error) {
	nft, err := knftables.New(knftables.InetFamily, NFTablesTable)
	if err != nil {
		return nil, err
	}
	return &NFTables{nft: nft}, nil
}

// Name implements Backend.
func (b *NFTables) Name() string { return "nftables" }

func nftSetName(k setKind) string { return k.name("masq-src", "nomasq-dst") }

func nftRules(d *Desired) []string {
	masq := "masquerade"
	if d.RandomFully {
		masq += " fully-random"
	}
	return []string{
		// A packet to one of the node's own addresses is never rewritten (as ip-masq-agent).
		"fib daddr type local return",
		fmt.Sprintf("ip saddr @%s ip daddr != @%s %s", nftSetName(setKind{0, true}), nftSetName(setKind{0, false}), masq),
		fmt.Sprintf("ip6 saddr @%s ip6 daddr != @%s %s", nftSetName(setKind{1, true}), nftSetName(setKind{1, false}), masq),
	}
}

func (b *NFTables) writeFull(tx *knftables.Transaction, d *Desired) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("netwarden masquerade; managed, do not edit")})
	for _, k := range setKinds {
		typ := "ipv4_addr"
		if k.family == 1 {
			typ = "ipv6_addr"
		}
		tx.Add(&knftables.Set{Name: nftSetName(k), Type: typ, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
		for _, r := range k.ranges(d) {
			tx.Add(&knftables.Element{Set: nftSetName(k), Key: []string{r.String()}})
		}
	}
	tx.Add(&knftables.Chain{
		Name:     nftChain,
		Type:     knftables.PtrTo(knftables.NATType),
		Hook:     knftables.PtrTo(knftables.PostroutingHook),
		Priority: knftables.PtrTo(knftables.SNATPriority),
	})
	for _, r := range nftRules(d) {
		tx.Add(&knftables.Rule{Chain: nftChain, Rule: r})
	}
}

// Render implements Backend. It touches no kernel, so a zero NFTables renders too.
func (b *NFTables) Render(d *Desired) string {
	tx := knftables.NewFake(knftables.InetFamily, NFTablesTable).NewTransaction()
	b.writeFull(tx, d)
	return tx.String()
}

// FullSync implements Backend: the table is replaced in one transaction, so a restarted agent
// converges from whatever the kernel holds with no window (conntrack keeps existing
// translations).
func (b *NFTables) FullSync(ctx context.Context, d *Desired) (dataplane.SyncResult, error) {
	tx := b.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	b.writeFull(tx, d)
	if err := command.Tracked("nft", func() error { return b.nft.Run(ctx, tx) }); err != nil {
		b.applied = nil
		return dataplane.SyncResult{Full: true}, fmt.Errorf("nftables masquerade full sync: %w", err)
	}
	b.applied = d
	b.rules = nil
	return dataplane.SyncResult{Full: true, Operations: tx.NumOperations(), Size: size(d)}, nil
}

// Sync implements Backend: after the first sync only set elements change, unless the rules
// themselves do (a different --random-fully after a restart takes the full path). The
// elements go over netlink, on a socket kept open, as one batch: one transaction, and no
// wait for the kernel to free removed ranges (see nftnl.Conn).
func (b *NFTables) Sync(ctx context.Context, d *Desired) (dataplane.SyncResult, error) {
	if b.applied == nil || b.applied.RandomFully != d.RandomFully {
		return b.FullSync(ctx, d)
	}
	var changes []elementChange
	ops := 0
	for _, k := range setKinds {
		add, remove := rangeDiff(k.ranges(b.applied), k.ranges(d))
		if len(add)+len(remove) > 0 {
			changes = append(changes, elementChange{set: nftSetName(k), add: add, remove: remove})
			ops += len(add) + len(remove)
		}
	}
	if ops == 0 {
		return dataplane.SyncResult{Size: size(d)}, nil
	}
	if err := b.applyElements(changes); err != nil {
		// The kernel no longer holds what we think (someone deleted the table): replace it.
		res, ferr := b.FullSync(ctx, d)
		res.Fallback = err.Error()
		return res, ferr
	}
	b.applied = d
	return dataplane.SyncResult{Operations: ops, Size: size(d)}, nil
}

// elementChange is what one interval set gains and loses in a sync.
type elementChange struct {
	set         string
	add, remove []Range
}

// applyElements sends every set's removals, then its additions, as one netlink batch.
// Removals go first so that a range whose end moves (10.0.0.0/9 becoming 10.0.0.0/8) can
// re-add its start element within the same transaction.
func (b *NFTables) applyElements(changes []elementChange) error {
	table := &gnft.Table{Name: NFTablesTable, Family: gnft.TableFamilyINet}
	encode := func(rs []Range) []gnft.SetElement {
		var out []gnft.SetElement
		for _, r := range rs {
			out = append(out, nftnl.IntervalElements(r.First, r.Last)...)
		}
		return out
	}
	set := func(name string) *gnft.Set { return &gnft.Set{Table: table, Name: name, Interval: true} }
	return b.conn.Batch(func(conn *gnft.Conn) error {
		for _, c := range changes {
			if len(c.remove) == 0 {
				continue
			}
			if err := conn.SetDeleteElements(set(c.set), encode(c.remove)); err != nil {
				return fmt.Errorf("set %s: %w", c.set, err)
			}
		}
		for _, c := range changes {
			if len(c.add) == 0 {
				continue
			}
			if err := conn.SetAddElements(set(c.set), encode(c.add)); err != nil {
				return fmt.Errorf("set %s: %w", c.set, err)
			}
		}
		return nil
	})
}

// Verify implements Backend: the chain must hold our rules (compared with the kernel's own
// listing after our last sync) and every set exactly the applied ranges.
func (b *NFTables) Verify(ctx context.Context) error {
	if b.applied == nil {
		return errors.New("nothing applied yet")
	}
	rules, err := b.nft.ListRules(ctx, nftChain)
	if err != nil {
		return fmt.Errorf("listing chain %s: %w", nftChain, err)
	}
	var texts []string
	for _, r := range rules {
		texts = append(texts, r.Rule)
	}
	if b.rules == nil {
		if len(texts) != len(nftRules(b.applied)) {
			return fmt.Errorf("chain %s has %d rules, want %d", nftChain, len(texts), len(nftRules(b.applied)))
		}
		b.rules = texts
	} else if !slices.Equal(texts, b.rules) {
		return fmt.Errorf("chain %s was changed: %q", nftChain, strings.Join(texts, "; "))
	}
	for _, k := range setKinds {
		have, err := listRanges(ctx, nftSetName(k))
		if err != nil {
			return fmt.Errorf("listing set %s: %w", nftSetName(k), err)
		}
		if want := k.ranges(b.applied); !sameAddresses(have, want, k.family == 1) {
			return fmt.Errorf("set %s holds %d elements, not the %d ranges last applied", nftSetName(k), len(have), len(want))
		}
	}
	return nil
}

// Cleanup implements Backend.
func (b *NFTables) Cleanup(ctx context.Context) error {
	tx := b.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := command.Tracked("nft", func() error { return b.nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("removing table inet %s: %w", NFTablesTable, err)
	}
	b.applied = nil
	return nil
}

// FullSyncIsAtomic implements dataplane.AtomicFullSync: the table is replaced in one transaction.
func (b *NFTables) FullSyncIsAtomic() {}

// CleanupNFTables removes the table an nftables backend left; nothing where nft does not work.
func CleanupNFTables(ctx context.Context) error {
	b, err := NewNFTables()
	if err != nil {
		return nil
	}
	return b.Cleanup(ctx)
}

func size(d *Desired) dataplane.Size {
	s := dataplane.Size{Chains: 1, Rules: 3, Sets: len(setKinds)}
	for _, k := range setKinds {
		s.Elements += len(k.ranges(d))
	}
	return s
}

// listRanges lists an interval set's elements. knftables' ListElements does not parse ranges
// ("a-b" elements, which merged CIDRs become), so this reads nft's JSON itself.
func listRanges(ctx context.Context, set string) ([]Range, error) {
	out, err := command.Run(ctx, nil, "nft", "--json", "list", "set", "inet", NFTablesTable, set)
	if err != nil {
		return nil, err
	}
	l, err := nftjson.Parse(out)
	if err != nil {
		return nil, fmt.Errorf("parsing nft output: %w", err)
	}
	var rs []Range
	for _, o := range l {
		if o.Kind != "set" {
			continue
		}
		for _, raw := range o.Elements() {
			first, last, err := nftjson.AddressRange(raw)
			if err != nil {
				return nil, err
			}
			rs = append(rs, Range{First: first, Last: last})
		}
	}
	return rs, nil
}

// KernelTables implements dataplane.KernelTables.
func (b *NFTables) KernelTables() []dataplane.KernelTable {
	return []dataplane.KernelTable{{Family: "inet", Name: NFTablesTable}}
}
