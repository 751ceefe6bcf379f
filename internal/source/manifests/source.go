package manifests

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

const (
	// A file renamed into the directory (written beside it and renamed over it, as editors,
	// tools and kubelet do) has its whole content the moment its name appears: it is read at
	// once, with whatever else the same read of events names that is complete too. Content
	// written in place comes in as many steps as its writer takes, and a burst of events (a
	// checkout, a save that truncates and writes) comes within well under a millisecond per
	// event: such a file is read once no event came for debounce. Reading what an event names
	// costs in proportion to it, so the wait grows only while events keep coming.
	defaultDebounce    = 2 * time.Millisecond
	defaultMaxDebounce = time.Second
	defaultResync      = 30 * time.Second
)

// Source is a cluster.Source that watches a directory of manifests.
type Source struct {
	dir    string
	logger *slog.Logger

	// Timings; tests change them.
	debounce    time.Duration // quiet time after a file system event before reading what changed
	maxDebounce time.Duration // longest delay of a read while events keep coming
	resync      time.Duration // periodic look for changes in case an event was missed

	running atomic.Bool
	synced  atomic.Bool
	state   atomic.Pointer[cluster.State]

	mu     sync.Mutex
	loader *loader
	errs   []error
	errMsg []string // messages of errs, to log only changes
}

var (
	_ cluster.Source     = (*Source)(nil)
	_ cluster.NodeLister = (*Source)(nil)
)

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

// Run loads the directory, then watches it and reads the files that events name (the whole
// directory when a dot-named directory or symlink changes, as a ConfigMap volume's "..data" does,
// or when the watcher missed events) until ctx is done; it returns nil then. Every resync period
// it also looks for files changed without an event (by their stat) and reads them. notify is
// called after the first load and after every change of the state. Run returns an error if the
// directory cannot be read or watched at start.
func (s *Source) Run(ctx context.Context, notify func()) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("manifests source: Run called twice")
	}
	w, err := newDirWatcher()
	if err != nil {
		return fmt.Errorf("watching manifests directory %s: %w", s.dir, err)
	}
	defer w.close()
	// Watch before the first read so that no change between the two is missed.
	if err := w.add(s.dir); err != nil {
		return fmt.Errorf("watching manifests directory %s: %w", s.dir, err)
	}
	// The first successful load marks the source synced, before notifying.
	if err := s.update(nil, true, notify); err != nil {
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
	var pending, pendingAll bool
	pendingNames := map[string]bool{} // read once the events settle
	ready := map[string]bool{}        // read now
	var firstEvent time.Time
	schedule := func() {
		now := time.Now()
		if !pending {
			pending, firstEvent = true, now
		}
		d := min(s.debounce, firstEvent.Add(s.maxDebounce).Sub(now))
		timer.Reset(max(d, 0))
	}
	read := func(names []string, all bool) {
		if !watching {
			if err := w.add(s.dir); err == nil {
				watching = true
				all = true
				s.logger.Info("watching manifests directory again", "dir", s.dir)
			}
		}
		if err := s.update(names, all, notify); err != nil {
			// The directory went away or became unreadable: keep the state in effect. Drop the watch
			// so that it is set up again on a directory that may be recreated.
			if watching {
				w.remove()
				watching = false
			}
		}
	}
	// The periodic look stats every file, which at thousands of files takes a while: it runs
	// beside the loop, and the loop reads what it found changed.
	type scanResult struct {
		files map[string]scanEntry
		err   error
	}
	scans := make(chan scanResult, 1)
	scanning := false

	for {
		select {
		case <-ctx.Done():
			if scanning {
				<-scans
			}
			return nil
		case evs, ok := <-w.events:
			if !ok {
				return errors.New("manifests source: file system watcher closed")
			}
			settle := false
			for _, ev := range evs {
				s.logger.Debug("manifests directory event", "event", ev.String())
				name, all, relevant := s.classify(ev)
				switch {
				case !relevant:
				case all:
					pendingAll, settle = true, true
				case ev.renamedIn():
					// In the order of the events: a write in place after the rename
					// makes the file wait again.
					ready[name] = true
					delete(pendingNames, name)
				default:
					pendingNames[name] = true
					delete(ready, name)
					settle = true
				}
			}
			if settle {
				schedule()
			}
			if len(ready) > 0 {
				names := slices.Collect(maps.Keys(ready))
				clear(ready)
				read(names, false)
			}
		case err, ok := <-w.errors:
			if !ok {
				return errors.New("manifests source: file system watcher closed")
			}
			// On an overflow (errOverflow) events were lost; on any other error they may
			// have been.
			s.logger.Warn("watching manifests directory; reading it all again", "dir", s.dir, "err", err)
			pendingAll = true
			schedule()
		case <-timer.C:
			names := slices.Collect(maps.Keys(pendingNames))
			all := pendingAll
			pending, pendingAll = false, false
			clear(pendingNames)
			read(names, all)
		case <-ticker.C:
			if !watching {
				read(nil, true)
				continue
			}
			if !scanning {
				scanning = true
				go func() {
					files, err := scanDir(s.dir)
					scans <- scanResult{files, err}
				}()
			}
		case sc := <-scans:
			scanning = false
			if sc.err != nil {
				read(nil, true) // reports the directory's problem
				continue
			}
			// The scan may predate events read since: at worst a file is read once more.
			s.mu.Lock()
			names := s.loader.stale(sc.files)
			s.mu.Unlock()
			if len(names) > 0 {
				read(names, false)
			}
		}
	}
}

// classify says what an event asks to read: the file it names, all files, or nothing.
func (s *Source) classify(ev dirEvent) (name string, all, relevant bool) {
	if ev.name == "" {
		return "", true, true // the directory itself went away or moved
	}
	name = ev.name
	if !strings.HasPrefix(name, ".") {
		ok, _ := manifestFile(name)
		return name, false, ok
	}
	// A dot-named directory or symlink may hold what the visible names point to: a ConfigMap
	// volume swaps its "..data" symlink to a new "..<timestamp>" directory, and its visible
	// names do not change. Other dot files (an editor's temporary copy) are not read.
	if strings.HasPrefix(name, "..") {
		return "", true, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info, err := os.Lstat(filepath.Join(s.dir, name))
	if err == nil && info.Mode()&(fs.ModeDir|fs.ModeSymlink) != 0 {
		s.loader.dotDirs[name] = true
		return "", true, true
	}
	if s.loader.dotDirs[name] {
		delete(s.loader.dotDirs, name)
		return "", true, true
	}
	return "", false, false
}

// update reads the named files, or the whole directory when all is set, publishes the new state
// if it changed and records the errors. It returns an error only when the directory itself cannot
// be read; the state is kept then.
func (s *Source) update(names []string, all bool, notify func()) error {
	s.mu.Lock()
	var errs []error
	var dirErr error
	if all {
		errs, dirErr = s.loader.loadAll()
	} else {
		errs, dirErr = s.loader.update(names)
	}
	if dirErr != nil {
		errs = []error{dirErr}
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
	// snapshot's Revision says it was read, and whoever wrote it waits for that. The objects
	// of such a file stay those published before, so the snapshot lists no change.
	prev := s.state.Load()
	var changed bool
	if dirErr == nil {
		st := s.loader.objects.Snapshot()
		if changed = st != prev; changed {
			s.state.Store(st)
			s.logger.Info("manifests loaded", "dir", s.dir, "files", s.loader.goodFiles, "read", len(names), "all", all,
				"problems", len(errs), "namespaces", len(st.Namespaces), "pods", st.Pods.Len(), "policies", len(st.Policies), "nodes", len(st.Nodes),
				"clusterPolicies", len(st.ClusterPolicies))
		}
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

// reload reads the whole directory (see update).
func (s *Source) reload(notify func()) error { return s.update(nil, true, notify) }
