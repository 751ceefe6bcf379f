package manifests

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

const (
	defaultDebounce    = 100 * time.Millisecond
	defaultMaxDebounce = time.Second
	defaultResync      = 30 * time.Second
)

// Source is a cluster.Source that watches a directory of manifests.
type Source struct {
	dir    string
	logger *slog.Logger

	// Timings; tests shorten them.
	debounce    time.Duration // quiet time after a file system event before re-reading
	maxDebounce time.Duration // longest delay of a re-read while events keep coming
	resync      time.Duration // periodic re-read in case an event was missed

	running atomic.Bool
	synced  atomic.Bool
	state   atomic.Pointer[cluster.State]

	mu     sync.Mutex
	loader *loader
	sum    [sha256.Size]byte
	errs   []error
	errMsg []string // messages of errs, to log only changes
}

var _ cluster.Source = (*Source)(nil)

// New returns a Source for the manifests in dir. Nothing is read until Run.
func New(dir string, logger *slog.Logger) *Source {
	logger = orDiscard(logger)
	s := &Source{
		dir:         dir,
		logger:      logger,
		debounce:    defaultDebounce,
		maxDebounce: defaultMaxDebounce,
		resync:      defaultResync,
		loader:      newLoader(dir, logger),
	}
	s.state.Store(cluster.NewState())
	return s
}

// HasSynced reports whether the first load has completed (even if some files had errors).
func (s *Source) HasSynced() bool { return s.synced.Load() }

// Snapshot returns the current state. Before the first load it is empty. The returned state and its
// objects are never modified.
func (s *Source) Snapshot() *cluster.State { return s.state.Load() }

// Nodes implements cluster.NodeLister.
func (s *Source) Nodes() (map[string]*corev1.Node, cluster.Revision) {
	st := s.state.Load()
	return st.Nodes, st.Revision
}

// Errors returns the problems found by the most recent (re)load.
func (s *Source) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}

// Run loads the directory, then watches it and re-reads it after changes (and every 30 seconds)
// until ctx is done; it returns nil then. notify is called after the first load and after every
// change of the state. Run returns an error if the directory cannot be read or watched at start.
func (s *Source) Run(ctx context.Context, notify func()) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("manifests source: Run called twice")
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching manifests directory %s: %w", s.dir, err)
	}
	defer w.Close()
	// Watch before the first read so that no change between the two is missed.
	if err := w.Add(s.dir); err != nil {
		return fmt.Errorf("watching manifests directory %s: %w", s.dir, err)
	}
	// The first successful load marks the source synced, before notifying.
	if err := s.reload(notify); err != nil {
		return err
	}
	watching := true

	ticker := time.NewTicker(s.resync)
	defer ticker.Stop()
	timer := time.NewTimer(0)
	if !timer.Stop() {
		<-timer.C
	}
	defer timer.Stop()
	var pending bool
	var firstEvent time.Time
	schedule := func() {
		now := time.Now()
		if !pending {
			pending, firstEvent = true, now
		}
		d := min(s.debounce, firstEvent.Add(s.maxDebounce).Sub(now))
		timer.Reset(max(d, 0))
	}
	reload := func() {
		if !watching {
			if err := w.Add(s.dir); err == nil {
				watching = true
				s.logger.Info("watching manifests directory again", "dir", s.dir)
			}
		}
		if err := s.reload(notify); err != nil {
			// The directory went away or became unreadable: keep the state in effect. Drop the watch
			// so that it is set up again on a directory that may be recreated.
			if watching {
				_ = w.Remove(s.dir)
				watching = false
			}
		}
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("manifests source: file system watcher closed")
			}
			// Every event counts, dot files included: a ConfigMap volume is updated by swapping
			// its "..data" symlink, while the visible file names do not change.
			s.logger.Debug("manifests directory event", "event", ev.String())
			schedule()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("manifests source: file system watcher closed")
			}
			s.logger.Warn("watching manifests directory", "dir", s.dir, "err", err)
			schedule()
		case <-timer.C:
			pending = false
			reload()
		case <-ticker.C:
			reload()
		}
	}
}

// reload reads the directory, publishes the new state if it changed and records the errors. It
// returns an error only when the directory itself cannot be read; the state is kept then.
func (s *Source) reload(notify func()) error {
	s.mu.Lock()
	res, dirErr := s.loader.load()
	var errs []error
	if dirErr != nil {
		errs = []error{dirErr}
	} else {
		errs = res.errs
	}
	s.errs = errs
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	if !slices.Equal(msgs, s.errMsg) {
		for _, m := range msgs {
			s.logger.Error("manifest problem; the file's last good content (if any) stays in effect", "err", m)
		}
		if len(msgs) == 0 && len(s.errMsg) > 0 {
			s.logger.Info("manifest problems resolved", "dir", s.dir)
		}
		s.errMsg = msgs
	}
	// New content that leaves the objects as they were (a file rewritten with equal objects,
	// or with a problem, so that its last good content stays) is still published: the
	// snapshot's Revision says it was read, and whoever wrote it waits for that.
	prev := s.state.Load()
	objectsChanged := dirErr == nil && (!s.synced.Load() || res.sum != s.sum)
	changed := objectsChanged || dirErr == nil && !maps.Equal(res.read, prev.Revision.Files)
	if changed {
		st := res.state
		if !objectsChanged {
			// The same objects under a new Revision: keep the published ones, so that the
			// snapshot lists no change and consumers do no work.
			st = &cluster.State{Namespaces: prev.Namespaces, Pods: prev.Pods, Policies: prev.Policies, Nodes: prev.Nodes, Revision: res.state.Revision}
		}
		s.sum = res.sum
		// Unchanged files keep their objects, so a pointer comparison finds what changed.
		cluster.NumberAfter(st, prev)
		s.state.Store(st)
		s.logger.Info("manifests loaded", "dir", s.dir, "files", res.files, "problems", len(errs),
			"namespaces", len(st.Namespaces), "pods", len(st.Pods), "policies", len(st.Policies), "nodes", len(st.Nodes))
	}
	s.mu.Unlock()
	if dirErr == nil {
		s.synced.Store(true)
	}
	if changed && notify != nil {
		notify()
	}
	return dirErr
}
