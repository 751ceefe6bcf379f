// Package policy compiles Kubernetes NetworkPolicy semantics for one node into a backend-neutral
// Ruleset: which local pod IPs are isolated in each direction, which group of policies judges them,
// and each policy's allow rules expressed over named address sets. Backends (nftables, iptables)
// render a Ruleset; they never look at Kubernetes objects themselves.
package policy

import (
	"net/netip"

	"github.com/netwarden/netwarden/internal/sortedset"
)

// Direction is the side of a connection a policy rule judges.
type Direction string

const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// Protocol is a transport protocol named by a policy port.
type Protocol string

const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// Ruleset is the complete desired policy state of one node. Every name in it is stable: the same
// cluster state always compiles to the same names, so backends can diff two Rulesets cheaply.
type Ruleset struct {
	// Dispatch maps each isolated local pod IP to the group that judges it, per direction.
	// A pod IP absent from a direction's map is not isolated in that direction.
	Dispatch map[Direction]map[netip.Addr]string
	// Groups lists, for each group name, the policies (by chain name) that select its pods.
	// Pods selected by the same set of policies share one group, so the per-packet work is the
	// rules of exactly those policies.
	Groups map[string]Group
	// Policies holds the allow rules of each policy that selects at least one local pod.
	Policies map[string]*PolicyRules
	// AddrSets holds the IPs of pods matched by a peer selector, shared by identical selectors.
	AddrSets map[string]*AddrSet
	// CIDRSets holds ipBlock peers as disjoint prefixes (cidr minus except).
	CIDRSets map[string]*CIDRSet
	// NamedPortSets holds, for a (port name, protocol), every destination pod IP and the port
	// number that name resolves to on that pod.
	NamedPortSets map[string]*NamedPortSet

	// Admin and Baseline are the two tiers of ClusterNetworkPolicy, judged before and after
	// NetworkPolicy: Admin, then NetworkPolicy (Dispatch/Groups), then Baseline, then allow.
	Admin, Baseline Tier
	// ClusterPolicies holds, by chain name, one direction of each ClusterNetworkPolicy that
	// selects at least one local pod. Its peers name AddrSets, CIDRSets and NamedPortSets
	// like those of NetworkPolicies (identical selectors share a set).
	ClusterPolicies map[string]*ClusterPolicyRules
	// DomainSets holds the domainNames egress peers of ClusterNetworkPolicies, one per
	// domain pattern. Their addresses are not cluster state: the node learns them from the
	// cluster DNS's answers to its pods (internal/domains), and the kernel holds each for
	// its TTL. A backend declares the sets and leaves their elements to the learner.
	DomainSets map[string]*DomainSet
	// domains says which addresses the DomainSets admit, for the judge (see WithDomains).
	domains DomainAddrs

	// Staged, when the snapshot has staged policies, is how to judge connections also as they
	// will be once those are enforced, to report the difference (see StagedJudgement). The
	// sets its rules name are in the maps above. Nil when no policy is staged.
	Staged *StagedJudgement
}

// Tier is the dispatch of one ClusterNetworkPolicy tier: for each local pod IP a subject of
// the tier's policies, per direction, the group judging it. A pod IP absent from a
// direction's map is judged by no policy of the tier in that direction.
type Tier struct {
	Dispatch map[Direction]map[netip.Addr]string
	// Groups lists, for each group name, the ClusterPolicies chains that select its pods, in
	// the order they are judged: ascending priority, then name. The first rule of the first
	// policy that matches a packet decides.
	Groups map[string]Group
}

// TierName is which of the two tiers a ClusterNetworkPolicy belongs to.
type TierName string

const (
	AdminTier    TierName = "admin"
	BaselineTier TierName = "baseline"
)

// Action is what a matching ClusterNetworkPolicy rule does with a packet.
type Action string

const (
	// Accept allows the packet in this direction: later policies, NetworkPolicy and the
	// Baseline tier are not consulted.
	Accept Action = "accept"
	// Deny drops the packet (never rejects: a denied connection times out).
	Deny Action = "deny"
	// Pass skips the rest of the tier: Admin passes to NetworkPolicy, Baseline to allow.
	Pass Action = "pass"
)

// ClusterPolicyRules are one ClusterNetworkPolicy's rules for one direction, in order.
type ClusterPolicyRules struct {
	Tier      TierName
	Direction Direction
	Source    string // the ClusterNetworkPolicy's name, for comments and logs
	Priority  int32
	Rules     []ClusterRule
}

// ClusterRule is one rule of a ClusterNetworkPolicy: it matches when any of its peers and any
// of its ports match, with the same conventions as Rule (an empty Peers list is any peer, an
// empty Ports list any port and protocol). A rule that can match nothing (a peer of no field
// this agent knows, under Accept) is left out by the compiler.
type ClusterRule struct {
	Name   string // the rule's name in the object, may be empty
	Index  int    // the rule's position among the object's rules of this direction
	Action Action
	Peers  []Peer
	Ports  []PortMatch
}

// The values behind the pointers in a Ruleset are never modified once published: a compile
// that changes a set or a policy's rules publishes a new value. Consumers may therefore treat
// an unchanged pointer as unchanged content and skip work, which keeps incremental syncs small.

// AddrSet is a sorted set of pod IPs, both families.
type AddrSet struct {
	Addrs sortedset.Set[netip.Addr]
	// Prev is the version this one replaced, and Added and Removed the difference from it, so
	// a consumer that handled Prev can apply just the difference. Only the newest link is
	// kept: when a version is itself replaced, the compiler clears its Prev and delta.
	Prev           *AddrSet
	Added, Removed []netip.Addr
}

// CIDRSet is an ipBlock as disjoint prefixes of one family.
type CIDRSet struct {
	IPv6     bool
	Prefixes []netip.Prefix
}

// DomainSet is the addresses a domain name pattern admits: "api.example.com", or
// "*.example.com", which matches one or more labels before example.com but not example.com
// itself. Patterns are lower case, without the trailing dot.
type DomainSet struct {
	Pattern string
}

// DomainAddrs says which addresses the domainNames peers admit. The model cannot know them
// (they are learned from DNS answers on the node), so the judge asks.
type DomainAddrs interface {
	// Admits reports whether the DomainSet named set holds addr.
	Admits(set string, addr netip.Addr) bool
}

// WithDomains returns rs judging domainNames peers by d (nil: they admit nothing, as the
// kernel's sets do before any answer). rs itself is not modified.
func (rs *Ruleset) WithDomains(d DomainAddrs) *Ruleset {
	out := *rs
	out.domains = d
	return &out
}

// NamedPortSet is a sorted set of (pod IP, port) pairs, with the same version link as AddrSet.
type NamedPortSet struct {
	Entries        sortedset.Set[netip.AddrPort]
	Prev           *NamedPortSet
	Added, Removed []netip.AddrPort
}

// Group is a set of policies that jointly judge one direction for some pods.
type Group struct {
	Direction Direction
	Policies  []string // chain names of PolicyRules, sorted
}

// PolicyRules are one policy's rules for one direction. A packet is allowed by the policy when
// any rule matches.
type PolicyRules struct {
	Direction Direction
	Source    string // "namespace/name" of the NetworkPolicy, for comments and logs
	Rules     []Rule
}

// Rule matches when any of its peers and any of its ports match. An empty Peers list means any
// peer; an empty Ports list means any port and protocol.
type Rule struct {
	Peers []Peer
	Ports []PortMatch
}

// Peer is the remote side of a connection: the source for ingress, the destination for egress.
type Peer struct {
	// Exactly one is set.
	AddrSet string // pods selected by namespaceSelector/podSelector (name in AddrSets)
	CIDRSet string // ipBlock (name in CIDRSets)
	// DomainSet names a DomainSets entry: the addresses learned for a domain pattern (an
	// egress peer of ClusterNetworkPolicy Accept rules only).
	DomainSet string
	// IPv6 tells the family of a CIDRSet; address and domain sets hold both families.
	IPv6 bool
}

// PortMatch matches the destination port of a protocol.
type PortMatch struct {
	Protocol Protocol
	// Ranges lists destination port ranges; empty with NamedPortSet unset means every port.
	Ranges []PortRange
	// NamedPortSet, when set, names a NamedPortSets entry to match destination IP and port
	// together, because a named port may resolve to different numbers on different pods.
	NamedPortSet string
}

// PortRange is an inclusive range of ports; First == Last for a single port.
type PortRange struct{ First, Last uint16 }

// NewRuleset returns an empty Ruleset, which isolates nothing.
func NewRuleset() *Ruleset {
	return &Ruleset{
		Dispatch:      map[Direction]map[netip.Addr]string{Ingress: {}, Egress: {}},
		Groups:        map[string]Group{},
		Policies:      map[string]*PolicyRules{},
		AddrSets:      map[string]*AddrSet{},
		CIDRSets:      map[string]*CIDRSet{},
		NamedPortSets: map[string]*NamedPortSet{},

		Admin:           newTier(),
		Baseline:        newTier(),
		ClusterPolicies: map[string]*ClusterPolicyRules{},
		DomainSets:      map[string]*DomainSet{},
	}
}

func newTier() Tier {
	return Tier{Dispatch: map[Direction]map[netip.Addr]string{Ingress: {}, Egress: {}}, Groups: map[string]Group{}}
}

// Tier returns the tier named n.
func (rs *Ruleset) Tier(n TierName) *Tier {
	if n == AdminTier {
		return &rs.Admin
	}
	return &rs.Baseline
}
