package agent

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
)

// Status is what the agent has put in the kernel, served as JSON on /status. A writer of
// cluster state (a test, the demo, an operator's script) knows its write is enforced once the
// Revision of every enabled feature covers it: sync completion is read, never guessed.
type Status struct {
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
	Skipped []policy.SkippedPolicy `json:"skipped,omitempty"`
	// Repairs counts the times the kernel was found changed by someone else and the rules
	// were restored (counted once restored).
	Repairs uint64 `json:"repairs"`
	// LastError is why the latest sync failed; empty once a sync succeeds again.
	LastError string `json:"lastError,omitempty"`
}

// statusBoard holds the features' statuses for the health server and the sync loops.
type statusBoard struct {
	mu     sync.Mutex
	policy *FeatureStatus
	masq   *FeatureStatus
}

func (b *statusBoard) update(fs **FeatureStatus, fn func(*FeatureStatus)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cp := **fs // readers hold the old value; never change one they may hold
	fn(&cp)
	*fs = &cp
}

func (b *statusBoard) get() (policy, masq *FeatureStatus) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.policy, b.masq
}

// Status returns what the agent has applied so far.
func (a *Agent) Status() Status {
	p, m := a.status.get()
	return Status{Ready: a.Ready(), NetworkPolicy: p, Masquerade: m}
}

// serveStatus answers GET /status. Query parameters file=NAME and resource=NAME (repeatable)
// restrict each feature's Revision to those entries, so a caller watching one file of
// thousands is not sent every hash.
func (a *Agent) serveStatus(w http.ResponseWriter, r *http.Request) {
	st := a.Status()
	q := r.URL.Query()
	files, resources := q["file"], q["resource"]
	if len(files) > 0 || len(resources) > 0 {
		for _, fs := range []**FeatureStatus{&st.NetworkPolicy, &st.Masquerade} {
			if *fs != nil {
				cp := **fs
				cp.Revision = cp.Revision.Only(files, resources)
				*fs = &cp
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st)
}
