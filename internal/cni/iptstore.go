package cni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/netwarden/netwarden/internal/kernel/xtables"
)

// IPTHook is a rule our setup appends to a built-in chain (once) to enter a group.
type IPTHook struct {
	Chain string // built-in chain, such as PREROUTING
	Rule  string // rule spec in iptables -S form, without "-A CHAIN"
}

// IPTLayout describes a plugin's chains in one iptables table (both families).
type IPTLayout struct {
	Table  string
	Hooks  []IPTHook
	Groups []string
}

// IPTStore keeps per-attachment chains in iptables and ip6tables with the same shape as
// NFTStore: hook -> GROUP-dispatch -> GROUP-bNN -> GROUP-<attachment ID>. Every change is one
// `restore --noflush` per family that names only the chains it rewrites.
type IPTStore struct {
	layout IPTLayout
	r      *xtables.Runner
}

// NewIPTStore returns a store using the iptables variant mode ("nft" or "legacy"), after
// checking that its commands work here (OpenStore chooses the variant).
func NewIPTStore(ctx context.Context, layout IPTLayout, mode string) (*IPTStore, error) {
	r, err := xtables.NewRunner(ctx, xtables.Mode(mode))
	if err != nil {
		return nil, err
	}
	return &IPTStore{layout: layout, r: r}, nil
}

// newIPTStoreUnchecked skips NewRunner's check of the variant's commands, for a configured or
// previously detected variant; a missing command then fails the operation itself.
func newIPTStoreUnchecked(layout IPTLayout, mode xtables.Mode) *IPTStore {
	return &IPTStore{layout: layout, r: &xtables.Runner{Mode: mode}}
}

func (s *IPTStore) Backend() string { return "iptables-" + string(s.r.Mode) }

// Release has nothing to do: every change runs iptables-restore, whose sockets end with it.
func (s *IPTStore) Release() {}

func (s *IPTStore) Status(ctx context.Context) error {
	for _, fam := range xtables.Families {
		if _, err := s.r.Save(ctx, fam, s.layout.Table); err != nil {
			return err
		}
	}
	return nil
}

var errNoChain = errors.New("no such chain")

// listChain returns a chain's rules in -S form ("-A CHAIN ..."), or errNoChain.
func (s *IPTStore) listChain(ctx context.Context, fam xtables.Family, chain string) ([]string, error) {
	out, err := s.r.Run(ctx, fam, "-t", s.layout.Table, "-S", chain)
	if err != nil {
		// iptables-nft 1.8.9 calls a missing chain "incompatible"; setup then creates it, and a
		// chain that really is incompatible fails the retry that follows.
		if msg := err.Error(); strings.Contains(msg, "No chain/target/match") || strings.Contains(msg, "does not exist") || strings.Contains(msg, "is incompatible") {
			return nil, errNoChain
		}
		return nil, err
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "-A ") {
			rules = append(rules, line)
		}
	}
	return rules, nil
}

func jumpTarget(rule string) string {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" {
			return f[i+1]
		}
	}
	return ""
}

func (s *IPTStore) setup(ctx context.Context, fam xtables.Family) error {
	saved, err := s.r.Save(ctx, fam, s.layout.Table)
	if err != nil {
		return err
	}
	var in bytes.Buffer
	fmt.Fprintf(&in, "*%s\n", s.layout.Table)
	for _, g := range s.layout.Groups {
		fmt.Fprintf(&in, ":%s - [0:0]\n", dispatchChain(g))
		for b := range Buckets {
			if !bytes.Contains(saved, []byte("\n:"+bucketChain(g, b)+" ")) {
				fmt.Fprintf(&in, ":%s - [0:0]\n", bucketChain(g, b))
			}
			fmt.Fprintf(&in, "-A %s -j %s\n", dispatchChain(g), bucketChain(g, b))
		}
	}
	in.WriteString("COMMIT\n")
	if err := s.r.Restore(ctx, fam, in.Bytes()); err != nil {
		return err
	}
	for _, h := range s.layout.Hooks {
		spec := strings.Fields(h.Rule)
		if _, err := s.r.Run(ctx, fam, append([]string{"-t", s.layout.Table, "-C", h.Chain}, spec...)...); err == nil {
			continue
		}
		if _, err := s.r.Run(ctx, fam, append([]string{"-t", s.layout.Table, "-A", h.Chain}, spec...)...); err != nil {
			return err
		}
	}
	return nil
}

func chainsByFamily(d Desired) map[xtables.Family][]Chain {
	out := map[xtables.Family][]Chain{}
	for _, c := range d.Chains {
		out[xtables.Family(c.Family)] = append(out[xtables.Family(c.Family)], c)
	}
	return out
}

func (s *IPTStore) Add(ctx context.Context, d Desired) error {
	id := d.Att.ID()
	for _, fam := range xtables.Families {
		chains := chainsByFamily(d)[fam]
		if len(chains) == 0 {
			continue
		}
		var in bytes.Buffer
		fmt.Fprintf(&in, "*%s\n", s.layout.Table)
		for _, c := range chains {
			name, bucket := attChain(c.Group, id), bucketChain(c.Group, BucketOf(id))
			kept, err := s.listChain(ctx, fam, bucket)
			if errors.Is(err, errNoChain) {
				if err := s.setup(ctx, fam); err != nil {
					return fmt.Errorf("%s: set up chains: %w", s.Backend(), err)
				}
				kept, err = s.listChain(ctx, fam, bucket)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.Backend(), err)
			}
			fmt.Fprintf(&in, ":%s - [0:0]\n:%s - [0:0]\n", bucket, name)
			for _, r := range c.Rules {
				fmt.Fprintf(&in, "-A %s %s\n", name, r)
			}
			for _, r := range kept {
				if jumpTarget(r) != name {
					in.WriteString(r + "\n")
				}
			}
			for _, j := range c.Jumps {
				fmt.Fprintf(&in, "-A %s %s -m comment --comment \"%s\" -j %s\n", bucket, j, jumpComment(name, d.Att), name)
			}
		}
		in.WriteString("COMMIT\n")
		if err := s.r.Restore(ctx, fam, in.Bytes()); err != nil {
			return fmt.Errorf("%s: add rules of %s: %w", s.Backend(), d.Att, err)
		}
	}
	return nil
}

func (s *IPTStore) Del(ctx context.Context, att Attachment) error {
	return s.delID(ctx, att.ID(), nil)
}

// delID removes an attachment's chains in every family; only, when not nil, limits it to the
// chains that exist (GC knows them from a save).
func (s *IPTStore) delID(ctx context.Context, id string, only map[string]bool) error {
	for _, fam := range xtables.Families {
		var in bytes.Buffer
		fmt.Fprintf(&in, "*%s\n", s.layout.Table)
		n := 0
		for _, g := range s.layout.Groups {
			name, bucket := attChain(g, id), bucketChain(g, BucketOf(id))
			if only != nil && !only[string(fam)+"/"+name] {
				continue
			}
			rules, err := s.listChain(ctx, fam, bucket)
			if errors.Is(err, errNoChain) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.Backend(), err)
			}
			fmt.Fprintf(&in, ":%s - [0:0]\n", bucket)
			for _, r := range rules {
				if jumpTarget(r) != name {
					in.WriteString(r + "\n")
				}
			}
			// Declaring the chain creates it if absent, so the delete never fails on missing state.
			fmt.Fprintf(&in, ":%s - [0:0]\n-X %s\n", name, name)
			n++
		}
		if n == 0 {
			continue
		}
		in.WriteString("COMMIT\n")
		if err := s.r.Restore(ctx, fam, in.Bytes()); err != nil {
			return fmt.Errorf("%s: delete rules of attachment %s: %w", s.Backend(), id, err)
		}
	}
	return nil
}

func (s *IPTStore) Check(ctx context.Context, d Desired) error {
	var errs []error
	id := d.Att.ID()
	for fam, chains := range chainsByFamily(d) {
		for _, h := range s.layout.Hooks {
			if _, err := s.r.Run(ctx, fam, append([]string{"-t", s.layout.Table, "-C", h.Chain}, strings.Fields(h.Rule)...)...); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: rule %q missing from %s", s.Backend(), fam, h.Rule, h.Chain))
			}
		}
		for _, c := range chains {
			var want []string
			for b := range Buckets {
				want = append(want, fmt.Sprintf("-A %s -j %s", dispatchChain(c.Group), bucketChain(c.Group, b)))
			}
			have, err := s.listChain(ctx, fam, dispatchChain(c.Group))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: chain %s: %w", s.Backend(), fam, dispatchChain(c.Group), err))
			} else if err := diffRules(dispatchChain(c.Group), want, have); err != nil {
				errs = append(errs, err)
			}
			name, bucket := attChain(c.Group, id), bucketChain(c.Group, BucketOf(id))
			bucketRules, err := s.listChain(ctx, fam, bucket)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: chain %s: %w", s.Backend(), fam, bucket, err))
				continue
			}
			jumps := 0
			for _, r := range bucketRules {
				if jumpTarget(r) == name {
					jumps++
				}
			}
			if jumps != len(c.Jumps) {
				errs = append(errs, fmt.Errorf("%s %s: %s: %d jump rules to %s, want %d", s.Backend(), fam, d.Att, jumps, name, len(c.Jumps)))
			}
			want = want[:0]
			for _, r := range c.Rules {
				want = append(want, "-A "+name+" "+r)
			}
			have, err = s.listChain(ctx, fam, name)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %s: chain %s: %w", s.Backend(), fam, d.Att, name, err))
				continue
			}
			if err := diffRules(name, want, have); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %s: %w", s.Backend(), fam, d.Att, err))
			}
		}
	}
	return errors.Join(errs...)
}

// chains lists the attachment chains in a family's table as "family/name".
func (s *IPTStore) chains(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	for _, fam := range xtables.Families {
		saved, err := s.r.Save(ctx, fam, s.layout.Table)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(saved), "\n") {
			name, ok := strings.CutPrefix(line, ":")
			if !ok {
				continue
			}
			name, _, _ = strings.Cut(name, " ")
			for _, g := range s.layout.Groups {
				if attIDOf(g, name) != "" {
					out[string(fam)+"/"+name] = true
				}
			}
		}
	}
	return out, nil
}

func (s *IPTStore) GC(ctx context.Context, network string, valid map[string]bool) error {
	existing, err := s.chains(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", s.Backend(), err)
	}
	tag := NetworkTag(network)
	stale := map[string]bool{}
	for key := range existing {
		_, name, _ := strings.Cut(key, "/")
		for _, g := range s.layout.Groups {
			if id := attIDOf(g, name); id != "" && strings.HasPrefix(id, tag) && !valid[id] {
				stale[id] = true
			}
		}
	}
	var errs []error
	for id := range stale {
		errs = append(errs, s.delID(ctx, id, existing))
	}
	return errors.Join(errs...)
}
