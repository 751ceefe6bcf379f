package policy

import (
	"context"
	"net/netip"
	"time"

	"github.com/netwarden/netwarden/internal/dataplane"
)

// Backend programs a Ruleset into the kernel: the NetworkPolicy backends (nftables, iptables).
type Backend = dataplane.Backend[*Ruleset]

// What a NetworkPolicy backend may offer besides Backend, found by type assertion.

// DropLog configures the logging of packets the policy rules drop: each drop is sent to
// NFLOG group Group with its DropReasons ID as prefix, for packets of new connections
// only (each denied attempt once), at most Rate a second with bursts of Burst, limited in the
// kernel so that a flood of denied packets cannot flood the reader.
type DropLog struct {
	Group uint16
	Rate  uint32 // packets a second, per drop rule
	Burst uint32
}

// DropLogger is a NetworkPolicy backend that can log the packets its rules drop. SetDropLog is
// called before the first sync; nil (the default) logs nothing.
type DropLogger interface {
	SetDropLog(*DropLog)
}

// RuleCounter is what one counted rule of a backend has seen.
type RuleCounter struct {
	// Source is the Ruleset key of the policy, ClusterNetworkPolicy or group whose rule it
	// is (a key of Policies, ClusterPolicies or Groups).
	Source string
	// Rule tells the rule apart from the others of Source for as long as it exists; a rule
	// rewritten in place is a new rule, whose count starts again at zero.
	Rule    string
	Verdict string // accept, drop or pass
	Packets uint64
}

// PolicyCounters is a NetworkPolicy backend that can count the packets each policy's rules
// decide. SetPolicyCounters is called before the first sync; ReadCounters lists the counted
// rules and must not disturb a sync running at the same time.
type PolicyCounters interface {
	SetPolicyCounters(bool)
	ReadCounters(ctx context.Context) ([]RuleCounter, error)
}

// StagedCounter is how many connections one staged verdict rule of a backend has seen: new
// connections judged Outcome (WouldDeny or WouldAllow) due to Cause (a key of
// StagedJudgement.Causes).
type StagedCounter struct {
	Cause   string
	Outcome string
	// Rule tells the counter apart from others for as long as its rule exists; a rule written
	// anew is a new counter, which starts again at zero.
	Rule    string
	Packets uint64
}

// StagedReporter is a NetworkPolicy backend that judges each new connection also as the
// staged policies would (Ruleset.Staged) and records the differences in the kernel: counted
// always, and logged to NFLOG with StagedLogID prefixes when SetStagedLog has a configuration
// (called before the first sync). ReadStagedCounters must not disturb a sync running at the
// same time.
type StagedReporter interface {
	SetStagedLog(*DropLog)
	ReadStagedCounters(ctx context.Context) ([]StagedCounter, error)
}

// LearnedElement is an address a DomainSet holds for a while: the kernel drops it when
// Timeout has passed, unless it is written again first.
type LearnedElement struct {
	Set     string // a key of Ruleset.DomainSets
	Addr    netip.Addr
	Timeout time.Duration
	// Comment tells the answer that admitted it (name, server, TTL), as `explain` shows it.
	Comment string
}

// LearnedSource gives the elements each DomainSet holds now: what a sync writes into a
// DomainSet it creates (or re-creates, in a full sync), so that no learned address is missing
// from it for any time.
type LearnedSource interface {
	Learned(set string) []LearnedElement
}

// DomainLearning is a NetworkPolicy backend that holds DomainSets' elements for the learner
// (internal/domains). SetLearnedSource is called before the first sync. Admit writes elements
// into the kernel (in one transaction where the kernel has one: nftables), replacing the
// timeout of those it holds; elements of a
// set the kernel does not hold (yet) are left out, since the sync that creates it takes them
// from the source. Admit runs beside syncs.
type DomainLearning interface {
	SetLearnedSource(LearnedSource)
	Admit(elems []LearnedElement) error
}

// LearnedReader is a DomainLearning backend that reads back what the kernel's DomainSets hold,
// with the time left, for a restarted learner to start from: before the first sync where that
// sync replaces them (nftables), or after it.
type LearnedReader interface {
	ReadLearned() ([]LearnedElement, error)
}
