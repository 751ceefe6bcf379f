package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
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
	// version counts changes; changed, when a long poll waits, is closed at the next one.
	version uint64
	changed chan struct{}
}

func (b *statusBoard) update(fs **FeatureStatus, fn func(*FeatureStatus)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cp := **fs // readers hold the old value; never change one they may hold
	fn(&cp)
	*fs = &cp
	b.changedLocked()
}

// touch records a change of what Status reads from elsewhere (readiness).
func (b *statusBoard) touch() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.changedLocked()
}

func (b *statusBoard) changedLocked() {
	b.version++
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

func (b *statusBoard) get() (policy, masq *FeatureStatus, version uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.policy, b.masq, b.version
}

// changedFrom returns a channel closed once the version is no longer v, or nil if it is not
// now. Not "greater than v": a caller may hold a version of an earlier process of the agent.
func (b *statusBoard) changedFrom(v uint64) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.version != v {
		return nil
	}
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// Status returns what the agent has applied so far.
func (a *Agent) Status() Status {
	p, m, v := a.status.get()
	return Status{Version: v, Ready: a.Ready(), NetworkPolicy: p, Masquerade: m}
}

// maxStatusWait bounds the wait= of a long poll of /status.
const maxStatusWait = 5 * time.Minute

// serveStatus answers GET /status. Query parameters file=NAME (repeatable) restrict each
// feature's Revision to those files' hashes, and resource=NAME to those resourceVersions (each
// list trims only its own half), so a caller watching one file of thousands is not sent every
// hash. With after=VERSION and wait=DURATION (together), the
// answer waits until the status is no longer at VERSION, or DURATION (at most 5m) ran out.
func (a *Agent) serveStatus(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("after") || q.Has("wait") {
		after, err := strconv.ParseUint(q.Get("after"), 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("/status: query parameter after=%q: want the version of a status read before (an unsigned integer), given with wait", q.Get("after")), http.StatusBadRequest)
			return
		}
		wait, err := time.ParseDuration(q.Get("wait"))
		if err != nil || wait < 0 || wait > maxStatusWait {
			http.Error(w, fmt.Sprintf("/status: query parameter wait=%q: want a duration from 0 to %s, such as 30s, given with after", q.Get("wait"), maxStatusWait), http.StatusBadRequest)
			return
		}
		if changed := a.status.changedFrom(after); changed != nil {
			timer := time.NewTimer(wait)
			select {
			case <-changed:
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			}
			timer.Stop()
		}
	}
	st := a.Status()
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
