package cni

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables/expr"
	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
)

// NFTBaseChain is a hooked chain of a plugin's table; its rules jump into group dispatch chains.
type NFTBaseChain struct {
	Name     string
	Type     knftables.BaseChainType
	Hook     knftables.BaseChainHook
	Priority knftables.BaseChainPriority
	Rules    []string
}

// NFTLayout describes a plugin's inet table: its base chains and its groups.
type NFTLayout struct {
	Table  string
	Base   []NFTBaseChain
	Groups []string
}

// NFTStore keeps per-attachment chains in one inet table:
//
//	base chain (hook) -> <group>-dispatch -> <group>-bNN (64 buckets) -> <group>-<attachment ID>
//
// A bucket holds the jump rules of the attachments hashed to it, commented with the target chain
// name, so DEL finds its rules by listing one short bucket.
type NFTStore struct {
	layout NFTLayout
	nft    *nftExec
	conn   nftnl.Conn
}

// NewNFTStore returns a store for layout, after checking that nft (>= 1.0.1, as knftables
// requires) works in this network namespace.
func NewNFTStore(layout NFTLayout) (*NFTStore, error) {
	if _, err := knftables.New(knftables.InetFamily, layout.Table); err != nil {
		return nil, err
	}
	return newNFTStoreUnchecked(layout), nil
}

// newNFTStoreUnchecked skips the check, for a netns where it passed before.
func newNFTStoreUnchecked(layout NFTLayout) *NFTStore {
	return &NFTStore{layout: layout, nft: newNFTExec(layout.Table)}
}

func (s *NFTStore) Backend() string { return "nftables" }

func (s *NFTStore) Release() { s.conn.Release() }

func (s *NFTStore) Status(ctx context.Context) error {
	if _, err := knftables.New(knftables.InetFamily, s.layout.Table); err != nil {
		return err
	}
	tx := s.nft.tx()
	tx.Add(&knftables.Table{})
	_, err := s.nft.nft(ctx, tx.String(), "--check", "-f", "-")
	return err
}

func (s *NFTStore) setup(ctx context.Context) error {
	if _, err := knftables.New(knftables.InetFamily, s.layout.Table); err != nil {
		return fmt.Errorf("nftables unusable: %w", err)
	}
	tx := s.nft.tx()
	tx.Add(&knftables.Table{})
	for _, g := range s.layout.Groups {
		d := dispatchChain(g)
		tx.Add(&knftables.Chain{Name: d})
		tx.Flush(&knftables.Chain{Name: d})
		for b := range Buckets {
			tx.Add(&knftables.Chain{Name: bucketChain(g, b)})
			tx.Add(&knftables.Rule{Chain: d, Rule: "jump " + bucketChain(g, b)})
		}
	}
	for _, bc := range s.layout.Base {
		tx.Add(&knftables.Chain{Name: bc.Name, Type: &bc.Type, Hook: &bc.Hook, Priority: &bc.Priority})
		tx.Flush(&knftables.Chain{Name: bc.Name})
		for _, r := range bc.Rules {
			tx.Add(&knftables.Rule{Chain: bc.Name, Rule: r})
		}
	}
	if err := s.nft.run(ctx, tx); err != nil {
		return fmt.Errorf("nftables: create table %s: %w", s.layout.Table, err)
	}
	return nil
}

func (s *NFTStore) addTx(d Desired) *knftables.Transaction {
	id := d.Att.ID()
	tx := s.nft.tx()
	for _, c := range d.Chains {
		name := attChain(c.Group, id)
		tx.Create(&knftables.Chain{Name: name})
		for _, r := range c.Rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
		bucket := bucketChain(c.Group, BucketOf(id))
		for _, j := range c.Jumps {
			tx.Add(&knftables.Rule{Chain: bucket, Rule: strings.TrimSpace(j + " jump " + name), Comment: knftables.PtrTo(jumpComment(name, d.Att))})
		}
	}
	return tx
}

func (s *NFTStore) Add(ctx context.Context, d Desired) error {
	if len(d.Chains) == 0 {
		// Nothing to install; a repeated ADD must still drop what the attachment had.
		return s.delID(d.Att.ID())
	}
	apply := func() error {
		err := s.addNetlink(d)
		if errors.Is(err, errNotCompilable) {
			err = s.addText(ctx, d)
		}
		return err
	}
	err := apply()
	if errors.Is(err, errNFTNotFound) {
		// First use on this node (or someone removed our table): build it, then retry.
		if err := s.setup(ctx); err != nil {
			return err
		}
		err = apply()
	}
	if err != nil {
		return fmt.Errorf("nftables: add rules of %s: %w", d.Att, err)
	}
	return nil
}

var errNotCompilable = errors.New("rules outside the netlink dialect")

// addNetlink installs d as one netlink batch, without an nft process.
func (s *NFTStore) addNetlink(d Desired) error {
	type rule struct {
		chain, comment string
		exprs          []expr.Any
	}
	id := d.Att.ID()
	var chains []string
	var rules []rule
	for _, c := range d.Chains {
		name := attChain(c.Group, id)
		chains = append(chains, name)
		for _, r := range c.Rules {
			e, ok := compileRule(r)
			if !ok {
				return errNotCompilable
			}
			rules = append(rules, rule{chain: name, exprs: e})
		}
		for _, j := range c.Jumps {
			e, ok := compileRule(strings.TrimSpace(j + " jump " + name))
			if !ok {
				return errNotCompilable
			}
			rules = append(rules, rule{chain: bucketChain(c.Group, BucketOf(id)), comment: jumpComment(name, d.Att), exprs: e})
		}
	}
	nl := newNFTNetlink(&s.conn, s.layout.Table)
	exists, err := nl.chainExists(chains[0])
	if err != nil {
		return err
	}
	if exists {
		// A repeated ADD of the same attachment replaces its rules.
		if err := s.delID(id); err != nil {
			return err
		}
	}
	for _, name := range chains {
		nl.addChain(name)
	}
	for _, r := range rules {
		nl.addRule(r.chain, r.exprs, r.comment)
	}
	return nl.commit()
}

// addText installs d through nft, for rules (user conditions) that only nft can parse.
func (s *NFTStore) addText(ctx context.Context, d Desired) error {
	err := s.nft.run(ctx, s.addTx(d))
	if errors.Is(err, errNFTExists) {
		if err := s.delID(d.Att.ID()); err != nil {
			return err
		}
		err = s.nft.run(ctx, s.addTx(d))
	}
	return err
}

// jumpsTo lists the bucket rules that jump to the attachment's chain in group.
func jumpsTo(nl *nftNetlink, group, id string) ([]nftRule, error) {
	rules, err := nl.rules(bucketChain(group, BucketOf(id)))
	if err != nil {
		return nil, err
	}
	name := attChain(group, id)
	var out []nftRule
	for _, r := range rules {
		if isJumpComment(r.Comment, name) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *NFTStore) Del(_ context.Context, att Attachment) error {
	return s.delID(att.ID())
}

func (s *NFTStore) delID(id string) error {
	nl := newNFTNetlink(&s.conn, s.layout.Table)
	for _, g := range s.layout.Groups {
		jumps, err := jumpsTo(nl, g, id)
		if errors.Is(err, errNFTNotFound) {
			continue // no table or bucket: nothing of ours can be there
		}
		if err != nil {
			return err
		}
		name := attChain(g, id)
		if len(jumps) == 0 {
			// Normally absent; if a crash or a hand edit left the chain, remove it too.
			exists, err := nl.chainExists(name)
			if err != nil {
				return err
			}
			if !exists {
				continue
			}
		}
		for _, r := range jumps {
			nl.deleteRule(r)
		}
		nl.deleteChain(name)
	}
	if err := nl.commit(); err != nil {
		return fmt.Errorf("delete rules of attachment %s: %w", id, err)
	}
	return nil
}

func (s *NFTStore) Check(ctx context.Context, d Desired) error {
	if len(d.Chains) == 0 {
		return nil // an attachment without rules needs no table either
	}
	var errs []error
	for _, bc := range s.layout.Base {
		have, err := s.nft.chainText(ctx, bc.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: table %s chain %s: %w", s.layout.Table, bc.Name, err))
			continue
		}
		if err := diffRules(bc.Name, bc.Rules, have); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range s.layout.Groups {
		have, err := s.nft.chainText(ctx, dispatchChain(g))
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: %w", err))
			continue
		}
		var want []string
		for b := range Buckets {
			want = append(want, "jump "+bucketChain(g, b))
		}
		if err := diffRules(dispatchChain(g), want, have); err != nil {
			errs = append(errs, err)
		}
	}
	nl := newNFTNetlink(&s.conn, s.layout.Table)
	id := d.Att.ID()
	for _, c := range d.Chains {
		name := attChain(c.Group, id)
		jumps, err := jumpsTo(nl, c.Group, id)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: %s: list %s: %w", d.Att, bucketChain(c.Group, BucketOf(id)), err))
			continue
		}
		if len(jumps) != len(c.Jumps) {
			errs = append(errs, fmt.Errorf("nftables: %s: %d jump rules to %s, want %d", d.Att, len(jumps), name, len(c.Jumps)))
		}
		have, err := s.nft.chainText(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: %s: %w", d.Att, err))
			continue
		}
		if err := diffRules(name, c.Rules, have); err != nil {
			errs = append(errs, fmt.Errorf("nftables: %s: %w", d.Att, err))
		}
	}
	return errors.Join(errs...)
}

func (s *NFTStore) GC(ctx context.Context, network string, valid map[string]bool) error {
	chains, err := s.nft.listChains(ctx)
	if errors.Is(err, errNFTNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nftables: list chains of %s: %w", s.layout.Table, err)
	}
	stale := map[string]bool{}
	tag := NetworkTag(network)
	for _, name := range chains {
		for _, g := range s.layout.Groups {
			if id := attIDOf(g, name); id != "" && strings.HasPrefix(id, tag) && !valid[id] {
				stale[id] = true
			}
		}
	}
	var errs []error
	for id := range stale {
		errs = append(errs, s.delID(id))
	}
	return errors.Join(errs...)
}
