package cni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"sigs.k8s.io/knftables"
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
	nft    knftables.Interface
}

// NewNFTStore returns a store for layout, or an error when nft cannot be used here.
func NewNFTStore(layout NFTLayout) (*NFTStore, error) {
	nft, err := knftables.New(knftables.InetFamily, layout.Table)
	if err != nil {
		return nil, err
	}
	return &NFTStore{layout: layout, nft: nft}, nil
}

func (s *NFTStore) Backend() string { return "nftables" }

func (s *NFTStore) Status(ctx context.Context) error {
	tx := s.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	return s.nft.Check(ctx, tx)
}

func (s *NFTStore) setup(ctx context.Context) error {
	tx := s.nft.NewTransaction()
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
	if err := s.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("nftables: create table %s: %w", s.layout.Table, err)
	}
	return nil
}

func (s *NFTStore) addTx(d Desired) *knftables.Transaction {
	id := d.Att.ID()
	tx := s.nft.NewTransaction()
	for _, c := range d.Chains {
		name := attChain(c.Group, id)
		tx.Create(&knftables.Chain{Name: name})
		for _, r := range c.Rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
		bucket := bucketChain(c.Group, BucketOf(id))
		for _, j := range c.Jumps {
			tx.Add(&knftables.Rule{Chain: bucket, Rule: strings.TrimSpace(j + " jump " + name), Comment: knftables.PtrTo(name)})
		}
	}
	return tx
}

func (s *NFTStore) Add(ctx context.Context, d Desired) error {
	err := s.nft.Run(ctx, s.addTx(d))
	if knftables.IsNotFound(err) {
		// First use on this node (or someone removed our table): build it, then retry.
		if err := s.setup(ctx); err != nil {
			return err
		}
		err = s.nft.Run(ctx, s.addTx(d))
	}
	if knftables.IsAlreadyExists(err) {
		// A repeated ADD of the same attachment replaces its rules.
		if err := s.Del(ctx, d.Att); err != nil {
			return err
		}
		err = s.nft.Run(ctx, s.addTx(d))
	}
	if err != nil {
		return fmt.Errorf("nftables: add rules of %s: %w", d.Att, err)
	}
	return nil
}

// jumpsTo lists the bucket rules that jump to chain name.
func (s *NFTStore) jumpsTo(ctx context.Context, group, id string) ([]*knftables.Rule, error) {
	bucket := bucketChain(group, BucketOf(id))
	rules, err := s.nft.ListRules(ctx, bucket)
	if err != nil {
		return nil, err
	}
	name := attChain(group, id)
	var out []*knftables.Rule
	for _, r := range rules {
		if r.Comment != nil && *r.Comment == name {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *NFTStore) Del(ctx context.Context, att Attachment) error {
	return s.delID(ctx, att.ID())
}

func (s *NFTStore) delID(ctx context.Context, id string) error {
	tx := s.nft.NewTransaction()
	var orphans []string
	for _, g := range s.layout.Groups {
		jumps, err := s.jumpsTo(ctx, g, id)
		if knftables.IsNotFound(err) {
			continue // no table or bucket: nothing of ours can be there
		}
		if err != nil {
			return fmt.Errorf("nftables: list %s: %w", bucketChain(g, BucketOf(id)), err)
		}
		name := attChain(g, id)
		if len(jumps) == 0 {
			orphans = append(orphans, name)
			continue
		}
		for _, r := range jumps {
			tx.Delete(&knftables.Rule{Chain: r.Chain, Handle: r.Handle})
		}
		tx.Flush(&knftables.Chain{Name: name})
		tx.Delete(&knftables.Chain{Name: name})
	}
	if tx.NumOperations() > 0 {
		if err := s.nft.Run(ctx, tx); err != nil {
			return fmt.Errorf("nftables: delete rules of attachment %s: %w", id, err)
		}
	}
	// A chain nobody jumps to is normally absent; if a crash or a hand edit left it, remove it.
	for _, name := range orphans {
		tx := s.nft.NewTransaction()
		tx.Flush(&knftables.Chain{Name: name})
		tx.Delete(&knftables.Chain{Name: name})
		if err := s.nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
			return fmt.Errorf("nftables: delete chain %s: %w", name, err)
		}
	}
	return nil
}

// chainRules returns the rules of one chain as nft prints them, one per line, or an error
// satisfying knftables.IsNotFound when the chain does not exist.
func (s *NFTStore) chainRules(ctx context.Context, name string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "nft", "list", "chain", "inet", s.layout.Table, name)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No such file or directory") {
			return nil, notFound{name}
		}
		return nil, fmt.Errorf("nft list chain %s: %s", name, msg)
	}
	var rules []string
	depth := 0
	for _, line := range strings.Split(stdout.String(), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasSuffix(line, "{"):
			depth++
		case line == "}":
			depth--
		case depth == 2 && line != "" && !strings.HasPrefix(line, "type "):
			rules = append(rules, line)
		}
	}
	return rules, nil
}

type notFound struct{ what string }

func (e notFound) Error() string { return e.what + " does not exist" }

func (s *NFTStore) Check(ctx context.Context, d Desired) error {
	var errs []error
	for _, bc := range s.layout.Base {
		have, err := s.chainRules(ctx, bc.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: table %s chain %s: %w", s.layout.Table, bc.Name, err))
			continue
		}
		if err := diffRules(bc.Name, bc.Rules, have); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range s.layout.Groups {
		have, err := s.chainRules(ctx, dispatchChain(g))
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
	id := d.Att.ID()
	for _, c := range d.Chains {
		name := attChain(c.Group, id)
		jumps, err := s.jumpsTo(ctx, c.Group, id)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: %s: list %s: %w", d.Att, bucketChain(c.Group, BucketOf(id)), err))
			continue
		}
		if len(jumps) != len(c.Jumps) {
			errs = append(errs, fmt.Errorf("nftables: %s: %d jump rules to %s, want %d", d.Att, len(jumps), name, len(c.Jumps)))
		}
		have, err := s.chainRules(ctx, name)
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
	chains, err := s.nft.List(ctx, "chains")
	if knftables.IsNotFound(err) {
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
		errs = append(errs, s.delID(ctx, id))
	}
	return errors.Join(errs...)
}

// Rules lists every attachment chain of the table with its rules, for tests and diagnostics.
func (s *NFTStore) Rules(ctx context.Context) (map[string][]string, error) {
	chains, err := s.nft.List(ctx, "chains")
	if knftables.IsNotFound(err) {
		return map[string][]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, name := range chains {
		for _, g := range s.layout.Groups {
			if attIDOf(g, name) != "" {
				if out[name], err = s.chainRules(ctx, name); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}
