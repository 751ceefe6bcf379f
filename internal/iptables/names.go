package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"

	"github.com/netwarden/netwarden/internal/policy"
)

// Chain and set names. Every chain we own starts with ChainPrefix and every set with
// SetPrefix, which is how cleanup and a restarted agent find what an earlier run left.
const (
	ChainPrefix = "NETWARDEN-"
	SetPrefix   = "netwarden-"

	chainForward = ChainPrefix + "FORWARD"
	chainInput   = ChainPrefix + "INPUT"
	chainEgress  = ChainPrefix + "EGRESS"
	chainIngress = ChainPrefix + "INGRESS"
	groupPrefix  = ChainPrefix + "G-"

	// The ClusterNetworkPolicy tiers: the Admin tier's dispatch roots, and its and the
	// Baseline tier's group chains.
	chainAdminEgress    = ChainPrefix + "ADMIN-EGRESS"
	chainAdminIngress   = ChainPrefix + "ADMIN-INGRESS"
	adminGroupPrefix    = ChainPrefix + "A-"
	baselineGroupPrefix = ChainPrefix + "B-"

	// swapSet is the temporary set a full sync fills and swaps with a live one, so a set is
	// never seen empty or half-filled.
	swapSet = SetPrefix + "swap"

	maxChainName = 28
	maxSetName   = 31
	hashLen      = 16 // base32 characters: 80 bits
)

const (
	v4 = 0
	v6 = 1
)

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:])[:hashLen]
}

func famDigit(fam int) string {
	if fam == v6 {
		return "6"
	}
	return "4"
}

// Names derived from Ruleset names: the kind and family are spelled out, the Ruleset name is
// hashed, so names are deterministic and short whatever the namespace and policy names.
func groupChain(group string) string     { return groupPrefix + hashOf(group) }
func adminChain(group string) string     { return adminGroupPrefix + hashOf(group) }
func baselineChain(group string) string  { return baselineGroupPrefix + hashOf(group) }
func podSet(name string, fam int) string { return SetPrefix + "p" + famDigit(fam) + "-" + hashOf(name) }
func cidrSet(name string, fam int) string {
	return SetPrefix + "c" + famDigit(fam) + "-" + hashOf(name)
}
func domainSetName(name string, fam int) string {
	return SetPrefix + "d" + famDigit(fam) + "-" + hashOf(name)
}
func portSet(name string, fam int) string {
	return SetPrefix + "n" + famDigit(fam) + "-" + hashOf(name)
}

// dispatchChain names the dispatch chain for a subprefix; kind is E or I and the family digit.
func dispatchChain(kind string, p netip.Prefix) string {
	return ChainPrefix + kind + "-" + hashOf(p.String())[:maxChainName-len(ChainPrefix)-len(kind)-1]
}

// dropChain names the chain that logs and drops for one ClusterNetworkPolicy Deny rule.
func dropChain(id string) string { return ChainPrefix + "L-" + hashOf(id) }

// npRoot is the root of a direction's NetworkPolicy and Baseline dispatch: where an Admin
// Pass, and an Admin group that no rule of decides, go on.
func npRoot(dir policy.Direction) string {
	if dir == policy.Egress {
		return chainEgress
	}
	return chainIngress
}

// adminRoot is the root of a direction's Admin tier dispatch.
func adminRoot(dir policy.Direction) string {
	if dir == policy.Egress {
		return chainAdminEgress
	}
	return chainAdminIngress
}

func addrBits(fam int) int {
	if fam == v6 {
		return 128
	}
	return 32
}

func famOf(ip netip.Addr) int {
	if ip.Is6() {
		return v6
	}
	return v4
}

// checkNameLengths reports a chain or set name longer than iptables or ipset takes.
func (r *Rendered) checkNameLengths() {
	for fam := range r.Chains {
		for name := range r.Chains[fam] {
			if len(name) > maxChainName && r.err == nil {
				r.err = fmt.Errorf("chain name %s longer than %d characters", name, maxChainName)
			}
		}
	}
	for name := range r.Sets {
		if len(name) > maxSetName && r.err == nil {
			r.err = fmt.Errorf("set name %s longer than %d characters", name, maxSetName)
		}
	}
}
