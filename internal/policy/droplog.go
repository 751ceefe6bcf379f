package policy

import (
	"crypto/sha256"
	"encoding/base32"
	"sort"
	"strconv"
	"strings"
)

// Drop IDs name each place where the rules of a Ruleset drop a packet: the end of a
// NetworkPolicy group (default isolation) and each Deny rule of a ClusterNetworkPolicy. A
// backend that logs drops puts the ID in the log prefix, which the kernel limits (nft to 127
// bytes, NFLOG to 64 with iptables) far below what names of policies take; the agent maps an
// ID back to the objects with DropReasons. IDs are derived from the Ruleset's stable names,
// so every renderer and the agent agree on them without a table passed between them.

// DropIDPrefix starts every drop ID, so a reader can tell our log messages from others'.
const DropIDPrefix = "nw:"

var dropB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func dropHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return dropB32.EncodeToString(sum[:])[:16]
}

// GroupDropID is the ID of the drop that ends a NetworkPolicy group's chain.
func GroupDropID(group string) string { return DropIDPrefix + "g-" + dropHash(group) }

// ClusterRuleDropID is the ID of a ClusterNetworkPolicy Deny rule; chain is the
// ClusterPolicies key and index the rule's ClusterRule.Index.
func ClusterRuleDropID(chain string, index int) string {
	return DropIDPrefix + "c-" + dropHash(chain+"#"+strconv.Itoa(index))
}

// DropReason says why the rules behind one drop ID drop a packet.
type DropReason struct {
	Direction Direction
	// Policies are the NetworkPolicies ("namespace/name") isolating the pod, none of whose
	// rules admitted the packet; set for a group's drop.
	Policies []string
	// ClusterPolicy, Tier and Rule name the ClusterNetworkPolicy Deny rule that matched; Rule
	// is the rule's name, or its position when it has none.
	ClusterPolicy string
	Tier          TierName
	Rule          string
}

// Namespace is the namespace of the policies behind the drop ("" for a ClusterNetworkPolicy).
func (r DropReason) Namespace() string {
	if len(r.Policies) == 0 {
		return ""
	}
	ns, _, _ := strings.Cut(r.Policies[0], "/")
	return ns
}

// PolicyLabel names the policies behind the drop in one short string, for a metric label.
func (r DropReason) PolicyLabel() string {
	if r.ClusterPolicy != "" {
		return r.ClusterPolicy
	}
	names := make([]string, len(r.Policies))
	for i, p := range r.Policies {
		_, names[i], _ = strings.Cut(p, "/")
	}
	return strings.Join(names, ",")
}

// String spells the reason for a log line.
func (r DropReason) String() string {
	if r.ClusterPolicy != "" {
		return "denied by " + string(r.Tier) + " ClusterNetworkPolicy " + r.ClusterPolicy + " rule " + r.Rule
	}
	return "isolated by " + strings.Join(r.Policies, ", ") + "; no rule admits"
}

// DropReasons maps every drop ID of rs to its reason. It walks the whole Ruleset, so callers
// build it only when they need to resolve an ID, not on every sync.
func DropReasons(rs *Ruleset) map[string]DropReason {
	out := make(map[string]DropReason, len(rs.Groups))
	for name, g := range rs.Groups {
		r := DropReason{Direction: g.Direction}
		for _, p := range g.Policies {
			src := p
			if pr := rs.Policies[p]; pr != nil && pr.Source != "" {
				src = pr.Source
			}
			r.Policies = append(r.Policies, src)
		}
		sort.Strings(r.Policies)
		out[GroupDropID(name)] = r
	}
	for chain, cp := range rs.ClusterPolicies {
		for _, rule := range cp.Rules {
			if rule.Action != Deny {
				continue
			}
			name := rule.Name
			if name == "" {
				name = "#" + strconv.Itoa(rule.Index)
			}
			out[ClusterRuleDropID(chain, rule.Index)] = DropReason{Direction: cp.Direction, ClusterPolicy: cp.Source, Tier: cp.Tier, Rule: name}
		}
	}
	return out
}
