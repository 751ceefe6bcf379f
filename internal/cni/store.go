package cni

import (
	"context"
	"fmt"
	"strings"
)

// Chain is one of an attachment's chains: it lives in a group (a hook path such as "DNAT of host
// ports"), is entered from the group's bucket by one jump rule per entry in Jumps (each a match
// expression, "" for none), and holds Rules.
type Chain struct {
	Group string
	// Family is "ipv4" or "ipv6" for the iptables store, which keeps a table per family; the
	// nftables store keeps both families in one inet table and ignores it.
	Family string
	Jumps  []string
	Rules  []string
}

// Desired is every rule of one attachment, as one backend expresses them.
type Desired struct {
	Att    Attachment
	Chains []Chain
}

// Store keeps per-attachment chains in the kernel. Every method runs under the plugin's lock.
type Store interface {
	// Add installs d as one transaction (per table), replacing what the attachment had.
	Add(ctx context.Context, d Desired) error
	// Del removes the attachment's chains; missing state is not an error.
	Del(ctx context.Context, att Attachment) error
	// Check reports a missing or altered rule of d.
	Check(ctx context.Context, d Desired) error
	// GC removes the chains of network whose attachment ID is not in valid.
	GC(ctx context.Context, network string, valid map[string]bool) error
	// Status reports whether the backend can be used.
	Status(ctx context.Context) error
	// Backend names the backend ("nftables", "iptables-nft", "iptables-legacy").
	Backend() string
	// Release lets go of the store's kernel sockets when the plugin is done, without waiting
	// for the kernel to free what the last commit deleted.
	Release()
}

// attChain names an attachment's chain in a group.
func attChain(group, id string) string { return group + "-" + id }

// bucketChain names a group's bucket.
func bucketChain(group string, b int) string { return fmt.Sprintf("%s-b%02d", group, b) }

// dispatchChain names the chain that a group's hooks jump to and that jumps to every bucket.
func dispatchChain(group string) string { return group + "-dispatch" }

// attIDOf returns the attachment ID in an attachment chain name of group, or "" if name is not
// one (buckets, dispatch and base chains are not).
func attIDOf(group, name string) string {
	id, ok := strings.CutPrefix(name, group+"-")
	if !ok || len(id) != 8+1+12 || id[8] != '-' {
		return ""
	}
	return id
}

// diffRules explains how the kernel's rules of a chain differ from the wanted ones.
func diffRules(chain string, want, have []string) error {
	if strings.Join(want, "\n") == strings.Join(have, "\n") {
		return nil
	}
	haveSet := map[string]int{}
	for _, h := range have {
		haveSet[h]++
	}
	var missing []string
	for _, w := range want {
		if haveSet[w] > 0 {
			haveSet[w]--
			continue
		}
		missing = append(missing, w)
	}
	var extra []string
	for _, h := range have {
		if haveSet[h] > 0 {
			haveSet[h]--
			extra = append(extra, h)
		}
	}
	switch {
	case len(missing) > 0 && len(extra) > 0:
		return fmt.Errorf("chain %s: rule %q missing or altered (found %q instead)", chain, missing[0], extra[0])
	case len(missing) > 0:
		return fmt.Errorf("chain %s: rule %q missing", chain, missing[0])
	case len(extra) > 0:
		return fmt.Errorf("chain %s: unexpected rule %q", chain, extra[0])
	}
	return fmt.Errorf("chain %s: rules out of order: want %q, have %q", chain, want, have)
}
