package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/netwarden/netwarden/internal/statusapi"
)

// statusBoard holds the features' statuses for the health server and the sync loops.
type statusBoard struct {
	mu     sync.Mutex
	policy *statusapi.FeatureStatus
	masq   *statusapi.FeatureStatus
	// version counts changes; changed, when a long poll waits, is closed at the next one.
	version uint64
	changed chan struct{}
}

func (b *statusBoard) update(fs **statusapi.FeatureStatus, fn func(*statusapi.FeatureStatus)) {
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

func (b *statusBoard) get() (policy, masq *statusapi.FeatureStatus, version uint64) {
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
func (a *Agent) Status() statusapi.Status {
	p, m, v := a.status.get()
	return statusapi.Status{Version: v, Ready: a.Ready(), NetworkPolicy: p, Masquerade: m}
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
		for _, fs := range []**statusapi.FeatureStatus{&st.NetworkPolicy, &st.Masquerade} {
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
