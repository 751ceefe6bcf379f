// Package dataplane is the contract between a feature's sync loop and the kernel backends that
// program it, whatever the feature. It imports nothing of ours, so that every feature's model
// and every backend can import it without dragging another feature along.
package dataplane

import "context"

// Backend programs a desired state D into the kernel. Each feature instantiates it over its
// own model: policy.Backend over *policy.Ruleset, masquerade.Backend over *masquerade.Desired.
type Backend[D any] interface {
	// Name is the backend's name as the --backend flag, logs and metrics spell it.
	Name() string
	// Sync makes the kernel hold d in one transaction, sending only the difference from the
	// last successful sync when it can.
	Sync(ctx context.Context, d D) (SyncResult, error)
	// FullSync replaces everything the backend owns with d in one transaction.
	FullSync(ctx context.Context, d D) (SyncResult, error)
	// Verify reports an error when the kernel no longer holds what was last applied.
	Verify(ctx context.Context) error
	// Cleanup removes everything the backend installed.
	Cleanup(ctx context.Context) error
	// Render returns the complete rules for d as the backend would apply them, touching nothing.
	Render(d D) string
}

// AtomicFullSync is a backend whose FullSync is one kernel transaction: its success is the
// proof that the kernel holds the state, with no need to read it back.
type AtomicFullSync interface {
	FullSyncIsAtomic()
}

// SyncResult describes one kernel transaction.
type SyncResult struct {
	Full       bool // the whole ruleset was replaced
	Operations int  // commands in the transaction; 0 means the kernel already matched
	// Fallback, when set, is why the sync took a slower path: an incremental sync that had to
	// replace everything, or a full sync that went through nft rather than netlink.
	Fallback string
	// Size is what the kernel holds for this backend after the sync.
	Size Size
	// Skipped lists the policies the backend cannot express, sorted by name. Each is applied
	// fail-closed: the pods it selects stay isolated in its directions, and it admits nothing.
	// Every other policy is applied.
	Skipped []Skipped
}

// Skipped is a policy a backend cannot express, and why. It is defined here rather than in
// package policy, which decides it (policy.FailClosed, whose policy.SkippedPolicy is this type),
// because a SyncResult reports it and this package must not import a feature's model; the
// agent's /status reports it too (internal/statusapi), whose readers link no feature either.
type Skipped struct {
	Policy string `json:"policy"` // "namespace/name"
	Reason string `json:"reason"`
}

// Size counts the objects a backend keeps in the kernel.
type Size struct{ Chains, Rules, Sets, Elements int }

// Compactor is a backend that may apply a change as additions only and leave the removals it
// makes unreachable for later, because removing costs far more than adding (the iptables-nft
// NetworkPolicy backend). The sync loop compacts once no change has come for a while.
type Compactor interface {
	// CompactionPending reports whether removals are waiting.
	CompactionPending() bool
	// Compact applies them.
	Compact(ctx context.Context) (SyncResult, error)
}

// KernelTable names a netfilter table: Family as nft spells it (inet, ip, ip6), and Name.
// Legacy marks an iptables-legacy table (ip or ip6), which raises no notifications.
type KernelTable struct {
	Family, Name string
	Legacy       bool
}

// KernelTables is a backend whose rules live in netfilter tables (its own nf_tables ones, or
// iptables' built-in ones), so that the agent can watch for other processes' changes to them
// and verify at once rather than at the next resync.
type KernelTables interface {
	KernelTables() []KernelTable
}
