// Package statusapi is the contract of the agent's /status endpoint: what the agent has put in
// the kernel, and which cluster state that was. The agent (internal/agent) serves it on its
// health server; whoever writes cluster state and must know when the write is enforced (the
// simulated nodes of tests and the demo, an operator's script) reads it with Client and
// compares it with the write (Covers, CoversResource). It imports no package of ours but those
// of the values it carries (cluster.Revision, dataplane.Skipped), so that a reader links none of
// the agent, its backends or the kernel libraries they use.
package statusapi

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
)

// Status is what the agent has put in the kernel, served as JSON on /status. A writer of
// cluster state (a test, the demo, an operator's script) knows its write is enforced once the
// Revision of every enabled feature covers it: sync completion is read, never guessed.
type Status struct {
	// Version counts the changes of this status in this process. A caller that has seen
	// version V asks GET /status?after=V&wait=DURATION and is answered at the next change
	// (or when DURATION runs out) instead of polling.
	Version uint64 `json:"version"`
	// Ready: the first sync of every enabled feature succeeded.
	Ready         bool           `json:"ready"`
	NetworkPolicy *FeatureStatus `json:"networkPolicy,omitempty"`
	Masquerade    *FeatureStatus `json:"masquerade,omitempty"`
}

// FeatureStatus is the state of one feature's rules.
type FeatureStatus struct {
	Backend string `json:"backend"`
	// Generation numbers the snapshot of cluster state the kernel holds (it is also in the
	// "synced" log line and the netwarden_applied_generation metric); 0 before the first sync.
	// Numbers are this process's own: compare them only with each other.
	Generation uint64 `json:"generation"`
	// Revision is the source content of that snapshot (manifest file hashes, or the
	// resourceVersions the API watches reached).
	Revision cluster.Revision `json:"revision"`
	// AppliedAt is when the kernel transaction of Generation succeeded (or found the kernel
	// already matching).
	AppliedAt time.Time `json:"appliedAt,omitzero"`
	// EstablishedGeneration (NetworkPolicy) is the Generation whose rules established flows
	// were last re-judged by: every established flow those rules deny is stopped. It follows
	// Generation shortly after a change that may deny flows (the pass walks the conntrack table
	// beside the sync loop), at once after any other; EstablishedError is why the last pass
	// failed (it is retried). Where established flows are not re-judged (no conntrack guard,
	// or --keep-established), it follows Generation at once.
	EstablishedGeneration uint64 `json:"establishedGeneration,omitempty"`
	EstablishedError      string `json:"establishedError,omitempty"`
	// Config (masquerade) is the hex SHA-256 of the config file content the rules follow;
	// ConfigRead that of the bytes last read, valid or not, and ConfigError why they were
	// not taken. Empty when no file is configured.
	Config      string `json:"config,omitempty"`
	ConfigRead  string `json:"configRead,omitempty"`
	ConfigError string `json:"configError,omitempty"`
	// CompactionPending: removals that recent changes made unreachable wait for the rules to
	// be quiet (iptables-nft); the kernel enforces the state already, and holds more than it
	// needs until they are done.
	CompactionPending bool `json:"compactionPending,omitempty"`
	// Skipped lists the NetworkPolicies the backend cannot express, applied fail-closed (their
	// pods stay isolated, their rules admit nothing).
	Skipped []dataplane.Skipped `json:"skipped,omitempty"`
	// Repairs counts the times the kernel was found changed by someone else and the rules
	// were restored (counted once restored).
	Repairs uint64 `json:"repairs"`
	// LastError is why the latest sync failed; empty once a sync succeeds again.
	LastError string `json:"lastError,omitempty"`
}

// ContentHash spells the hash of a manifest file's content as Revision.Files does.
func ContentHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Covers reports whether each feature in st has applied a state holding exactly the given file
// contents (name to ContentHash; "" for a removed file). A feature that has not synced yet
// covers nothing.
func Covers(st Status, files map[string]string) bool {
	return everyFeature(st, func(fs *FeatureStatus) bool {
		for name, want := range files {
			if got, _ := fs.Revision.Files.Get(name); got != want {
				return false
			}
		}
		return true
	})
}

// CoversResource reports whether each feature in st has applied a state holding the write of
// resource at resourceVersion rv (the API source).
func CoversResource(st Status, resource string, rv uint64) bool {
	return everyFeature(st, func(fs *FeatureStatus) bool { return fs.Revision.Covers(resource, rv) })
}

// everyFeature reports whether st has an enabled feature and every enabled one has synced and
// passes applied.
func everyFeature(st Status, applied func(*FeatureStatus) bool) bool {
	for _, fs := range []*FeatureStatus{st.NetworkPolicy, st.Masquerade} {
		if fs != nil && (fs.Generation == 0 || !applied(fs)) {
			return false
		}
	}
	return st.NetworkPolicy != nil || st.Masquerade != nil
}
