// Package manifests provides cluster state read from a directory of Kubernetes manifest files, for
// running the agent without an API server (netwarden agent --manifests DIR).
//
// Every *.yaml, *.yml and *.json file directly in the directory is read (names starting with "."
// are ignored; symlinks are followed). A file may hold several YAML documents and List objects.
// Namespaces, Pods, NetworkPolicies (networking.k8s.io/v1), Nodes and ClusterNetworkPolicies
// (policy.networking.k8s.io/v1beta1, or v1alpha2 read as v1beta1) are used; other kinds are
// skipped. Objects are decoded strictly, defaulted and validated like the API server would.
//
// A file is taken as a whole: a file with any problem contributes the objects of its last good
// content (none if it never was good), so a typo while editing never removes rules that were in
// effect.
package manifests

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Load reads dir once. It returns the state built from every good file, and one error per problem
// (file + document + field); the errors are *Error values except for the directory itself. If dir
// cannot be read, the state is nil and the single error names dir.
func Load(dir string, logger *slog.Logger) (*cluster.State, []error) {
	l := newLoader(dir, orDiscard(logger))
	errs, err := l.loadAll()
	if err != nil {
		return nil, []error{err}
	}
	st := *l.objects.Snapshot()
	// A one-off read: not a snapshot in any sequence.
	st.Generation, st.Changes = 0, nil
	return &st, errs
}

func orDiscard(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return logger
}

// loader keeps the directory's files and what is needed for the last-good-content behaviour, and
// updates them for the files named, so that a change costs in proportion to the files it
// touches. It is not safe for concurrent use.
type loader struct {
	dir    string
	logger *slog.Logger
	// files holds every manifest file present, readable or not, with the latest parse of its
	// content (so that unchanged content is not parsed again, nor its skipped kinds logged) and
	// its content in effect.
	files map[string]*fileState
	// goodFiles counts the files with content in effect.
	goodFiles int
	// owner says, for each object in effect, which file it comes from.
	owner map[objKey]owned
	// held lists the files whose content is good but not in effect, because it defines objects
	// that other files hold: every update looks at them again, as their rivals may have let go.
	held map[string]bool
	// errs holds the problems of each file.
	errs map[string][]error
	// dotDirs lists the dot-named entries last seen as directories or symlinks, which may hold
	// the content behind the visible names (a ConfigMap volume's "..data").
	dotDirs map[string]bool
	// objects holds the objects in effect and the Revision, and makes the snapshots.
	objects *cluster.Tracker
	// interner shares the equal parts of the objects read (label sets above all).
	interner *cluster.Interner
}

// fileState is what was last read of one manifest file, and its content in effect.
type fileState struct {
	fc *fileContent // nil when it could not be read
	// good is the content in effect: the last content without problems (nil if none).
	good *fileContent
	err  error   // why it could not be read
	stat statKey // of the file as it was read
	// readAt is when (Unix nanoseconds), to tell content changed within the file system's
	// timestamp granularity.
	readAt int64
}

// statKey is what a stat says of a file's content, to find the files changed without reading them.
type statKey struct {
	size, mtime int64
	ino, dev    uint64
	mode        uint32
}

func statKeyOf(st *syscall.Stat_t) statKey {
	return statKey{size: st.Size, mtime: st.Mtim.Nano(), ino: st.Ino, dev: uint64(st.Dev), mode: st.Mode}
}

// owned is the file of an object in effect, and the object published for it.
type owned struct {
	file string
	// pub is the object published for the key: the object of file's content in effect, or an
	// equal object read earlier, kept so that a file rewritten with the same objects changes no
	// object of the snapshot.
	pub *object
}

func newLoader(dir string, logger *slog.Logger) *loader {
	return &loader{dir: dir, logger: logger, files: map[string]*fileState{},
		owner: map[objKey]owned{}, held: map[string]bool{}, errs: map[string][]error{}, dotDirs: map[string]bool{},
		objects: cluster.NewTracker(), interner: cluster.NewInterner()}
}

// manifestFile reports whether name is a file to read, and whether it is JSON.
func manifestFile(name string) (ok, isJSON bool) {
	if strings.HasPrefix(name, ".") {
		return false, false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		return true, false
	case ".json":
		return true, true
	}
	return false, false
}

// loadAll reads every file of the directory (a parse is reused when a file's content is
// unchanged) and updates the objects. The error is for the directory itself; the problems with
// files are returned.
func (l *loader) loadAll() ([]error, error) {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("reading manifests directory %s: %w", l.dir, unwrapPathError(err))
	}
	names := make([]string, 0, len(entries)+len(l.files))
	clear(l.dotDirs)
	for _, e := range entries {
		name := e.Name()
		if ok, _ := manifestFile(name); ok {
			names = append(names, name)
		} else if strings.HasPrefix(name, ".") && e.Type()&(fs.ModeDir|fs.ModeSymlink) != 0 {
			l.dotDirs[name] = true
		}
	}
	// Files that are gone are looked at too, and found gone.
	for name := range l.files {
		names = append(names, name)
	}
	return l.update(names)
}

// readResult is one file read by readFile.
type readResult struct {
	name   string
	gone   bool // absent, or not a regular file
	fc     *fileContent
	err    error
	stat   statKey
	readAt time.Time
}

// readFile reads and parses one file; prev is its previous parse, reused when the content is
// the same.
func (l *loader) readFile(name string, prev *fileContent) readResult {
	r := readResult{name: name, readAt: time.Now()}
	path := filepath.Join(l.dir, name)
	data, st, err := readRegular(path)
	if err != nil {
		if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
			r.gone = true
			return r
		}
		r.err = &Error{File: path, Item: -1, Err: err}
		return r
	}
	if data == nil {
		l.logger.Debug("ignoring manifest path that is not a regular file", "path", path, "mode", fmt.Sprintf("%#o", st.Mode))
		r.gone = true
		return r
	}
	r.stat = statKeyOf(&st)
	_, isJSON := manifestFile(name)
	if sum := sha256.Sum256(data); prev != nil && prev.sum == sum {
		r.fc = prev
	} else {
		r.fc = parseFile(path, data, sum, isJSON, l.interner, l.logger)
	}
	return r
}

// readRegular reads the file at path (following symlinks) with the stat of what it read; data is
// nil when that is not a regular file. It makes the fewest system calls it can (os.ReadFile
// also stats the path first and registers the descriptor with the poller): at thousands of
// files, a cold start spends a good part of its time in them.
func readRegular(path string) (data []byte, st syscall.Stat_t, err error) {
	var fd int
	for {
		// O_NONBLOCK: opening a FIFO must not wait for a writer; it changes nothing for a
		// regular file.
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, st, err
	}
	defer syscall.Close(fd)
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, st, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, st, nil
	}
	// One byte more than the size, so that a file that has not grown is read in one call: a
	// read that returns less than asked once the size is read is at the end of the file (no
	// second read to find it; a short read before that, on a file system that makes them, is
	// followed by more reads).
	data = make([]byte, 0, st.Size+1)
	for {
		if len(data) == cap(data) {
			data = slices.Grow(data, 4096)
		}
		want := cap(data) - len(data)
		n, err := syscall.Read(fd, data[len(data):cap(data)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, st, err
		}
		data = data[:len(data)+n]
		if n == 0 || n < want && int64(len(data)) >= st.Size {
			return data, st, nil
		}
	}
}

// parallelReads is the number of files from which reading is spread over the CPUs.
const parallelReads = 64

// readFiles reads the named files, in parallel when there are many: parsing YAML is most of the
// cost of a cold start.
func (l *loader) readFiles(names []string) []readResult {
	out := make([]readResult, len(names))
	prev := make([]*fileContent, len(names))
	for i, name := range names {
		if fs := l.files[name]; fs != nil {
			prev[i] = fs.fc
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(names)/parallelReads+1)
	if workers <= 1 {
		for i, name := range names {
			out[i] = l.readFile(name, prev[i])
		}
		return out
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				out[i] = l.readFile(names[i], prev[i])
			}
		}()
	}
	wg.Wait()
	return out
}

// update reads the named files again and updates the objects in effect. Files not named keep
// their content. The error is for the directory itself (gone while a named file was being
// looked for); nothing is changed then. The problems with files, all of them, are returned.
func (l *loader) update(names []string) ([]error, error) {
	names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { ok, _ := manifestFile(n); return !ok })
	slices.Sort(names)
	names = slices.Compact(names)
	reads := l.readFiles(names)
	for _, r := range reads {
		if r.gone {
			// A directory removed with its files first shows its files gone: keep them,
			// as for the directory.
			if _, err := os.Stat(l.dir); err != nil {
				return nil, fmt.Errorf("reading manifests directory %s: %w", l.dir, unwrapPathError(err))
			}
			break
		}
	}

	if len(l.files) == 0 && len(l.owner) == 0 {
		// The first read of the directory: its maps are made at their size rather than grown.
		l.files = make(map[string]*fileState, len(reads))
		l.owner = make(map[objKey]owned, len(reads))
	}
	// The content in effect of the files found gone, until it is replaced below.
	goneGood := map[string]*fileContent{}
	good := func(name string) *fileContent {
		if fs := l.files[name]; fs != nil {
			return fs.good
		}
		return goneGood[name]
	}
	candidates := make(map[string]bool, len(reads)+len(l.held))
	for _, r := range reads {
		candidates[r.name] = true
		prev := l.files[r.name]
		var prevGood *fileContent
		if prev != nil {
			prevGood = prev.good
		}
		switch {
		case r.gone:
			if prevGood != nil {
				goneGood[r.name] = prevGood
			}
			delete(l.files, r.name)
			l.objects.SetFile(r.name, "")
		case r.err != nil:
			l.files[r.name] = &fileState{good: prevGood, err: r.err, readAt: r.readAt.UnixNano()}
			l.objects.SetFile(r.name, "")
		default:
			l.files[r.name] = &fileState{fc: r.fc, good: prevGood, stat: r.stat, readAt: r.readAt.UnixNano()}
			l.objects.SetFile(r.name, hex.EncodeToString(r.fc.sum[:]))
		}
	}
	for name := range l.held {
		candidates[name] = true
	}
	files := slices.Sorted(maps.Keys(candidates))

	// A file's content is its new content when that is good, else its last good content.
	content := make(map[string]*fileContent, len(candidates))
	fresh := make(map[string]bool, len(candidates)) // files whose current content is good
	for _, name := range files {
		fs := l.files[name]
		switch {
		case fs == nil:
		case fs.fc != nil && len(fs.fc.errs) == 0:
			fresh[name] = true
			content[name] = fs.fc
		case fs.good != nil:
			content[name] = fs.good
		}
	}
	parsedGood := maps.Clone(fresh)
	dupErrs := l.resolveDuplicates(files, candidates, content, fresh)

	// Objects leave before any arrives, so that an object moving between files stays.
	removed := map[objKey]owned{}
	for _, name := range files {
		old := good(name)
		if old == nil || content[name] == old {
			continue
		}
		for _, o := range old.objects {
			if ow, ok := l.owner[o.key]; ok && ow.file == name {
				removed[o.key] = ow
				delete(l.owner, o.key)
			}
		}
	}
	for _, name := range files {
		fc := content[name]
		if fc == nil || fc == good(name) {
			continue
		}
		for _, o := range fc.objects {
			ow := owned{file: name, pub: o}
			if prev, ok := removed[o.key]; ok {
				delete(removed, o.key)
				if prev.pub.sameAs(o) {
					ow.pub = prev.pub
				}
			}
			l.owner[o.key] = ow
			if ow.pub == o {
				l.setObject(o.key, o.obj)
			}
		}
	}
	for key := range removed {
		l.setObject(key, nil)
	}

	for _, name := range files {
		fs := l.files[name]
		if good(name) != nil {
			l.goodFiles--
		}
		if fs != nil {
			// content is nil for a file gone.
			fs.good = content[name]
		}
		if content[name] != nil {
			l.goodFiles++
		}
		if parsedGood[name] && !fresh[name] {
			l.held[name] = true
		} else {
			delete(l.held, name)
		}
		switch {
		case fs == nil:
			delete(l.errs, name)
		case fs.err != nil:
			l.errs[name] = []error{fs.err}
		case len(fs.fc.errs) > 0:
			l.errs[name] = fs.fc.errs
		case len(dupErrs[name]) > 0:
			l.errs[name] = dupErrs[name]
		default:
			delete(l.errs, name)
		}
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(l.errs)) {
		errs = append(errs, l.errs[name]...)
	}
	slices.SortStableFunc(errs, compareErrors)
	return errs, nil
}

// setObject stores obj under key in the tracker, or removes key when obj is nil.
func (l *loader) setObject(key objKey, obj metav1.Object) {
	switch key.kind {
	case objNamespace:
		o, _ := obj.(*corev1.Namespace)
		l.objects.SetNamespace(key.id, o)
	case objNode:
		o, _ := obj.(*corev1.Node)
		l.objects.SetNode(key.id, o)
	case objPod:
		o, _ := obj.(*corev1.Pod)
		l.objects.SetPod(key.id, o)
	case objPolicy:
		o, _ := obj.(*networkingv1.NetworkPolicy)
		l.objects.SetPolicy(key.id, o)
	case objCNP:
		o, _ := obj.(*npav1beta1.ClusterNetworkPolicy)
		l.objects.SetClusterPolicy(key.id, o)
	}
}

// stale returns the files that a scan of the directory (see scanDir) shows changed since they
// were read, appeared or went away, without reading any.
func (l *loader) stale(scan map[string]scanEntry) []string {
	var names []string
	for name, e := range scan {
		fs := l.files[name]
		// A file written again within the timestamp granularity of the file system, with the
		// same size, looks unchanged: a file modified close to when it was read is read again.
		if fs == nil || e.err != nil || fs.err != nil || e.stat != fs.stat || e.stat.mtime >= fs.readAt-int64(racyWindow) {
			names = append(names, name)
		}
	}
	for name := range l.files {
		if _, ok := scan[name]; !ok {
			names = append(names, name)
		}
	}
	return names
}

// racyWindow bounds the timestamp granularity of file systems (coarse kernel clocks tick every
// few milliseconds; some file systems keep seconds).
const racyWindow = 2 * time.Second

// scanEntry is what scanDir found of one manifest file.
type scanEntry struct {
	stat statKey
	err  error
}

// scanDir lists the manifest files of dir with what a stat says of them; it reads none and
// touches no loader state, so that it can run beside the event loop.
func scanDir(dir string) (map[string]scanEntry, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string]scanEntry, len(entries))
	for _, e := range entries {
		if ok, _ := manifestFile(e.Name()); !ok {
			continue
		}
		var st syscall.Stat_t
		err := syscall.Stat(filepath.Join(dir, e.Name()), &st)
		switch {
		case err != nil:
			out[e.Name()] = scanEntry{err: err}
		case st.Mode&syscall.S_IFMT == syscall.S_IFREG:
			out[e.Name()] = scanEntry{stat: statKeyOf(&st)}
		}
	}
	return out, nil
}

// resolveDuplicates finds objects defined in more than one file. The file that defined the object
// in the previous state keeps it (or, when none did, the lexically first file); a file with new
// content that loses an object is treated like a broken file: it keeps its last good content.
// files (sorted) are the files being updated and content their content, which is updated in
// place; every other file keeps the objects it owns. The problems are returned by file.
func (l *loader) resolveDuplicates(files []string, updating map[string]bool, content map[string]*fileContent, fresh map[string]bool) map[string][]error {
	type loss struct {
		obj    *object
		winner string
	}
	errs := map[string][]error{}
	for {
		// Sized by the objects of the files being updated, not by every object in effect: a
		// change of one file must not allocate for the whole directory.
		n := 0
		for _, name := range files {
			if fc := content[name]; fc != nil {
				n += len(fc.objects)
			}
		}
		providers := make(map[objKey][]string, n)
		for _, name := range files {
			fc := content[name]
			if fc == nil {
				continue
			}
			for _, o := range fc.objects {
				providers[o.key] = append(providers[o.key], name)
			}
		}
		// objectIn returns the object key of a file's content; looked up only for duplicates,
		// which are rare, rather than indexed for every object.
		objectIn := func(key objKey, name string) *object {
			fc := content[name]
			if !updating[name] {
				fc = l.files[name].good
			}
			for _, o := range fc.objects {
				if o.key == key {
					return o
				}
			}
			return nil
		}
		losses := map[string][]loss{}
		for key, names := range providers {
			// A file not being updated that holds the object holds it still.
			if ow, ok := l.owner[key]; ok && !updating[ow.file] {
				names = append(names, ow.file)
				slices.Sort(names)
			}
			if len(names) < 2 {
				continue
			}
			winner := names[0]
			if prev, ok := l.owner[key]; ok && slices.Contains(names, prev.file) {
				winner = prev.file
			}
			for _, name := range names {
				if name == winner {
					continue
				}
				if !fresh[name] {
					// Cannot happen: content in effect before had no duplicates, and the previous
					// owner of a key always wins. Drop the object rather than the file.
					l.logger.Error("manifests: unexpected duplicate in retained content", "file", name, "object", key.String())
					continue
				}
				losses[name] = append(losses[name], loss{obj: objectIn(key, name), winner: winner})
			}
		}
		if len(losses) == 0 {
			return errs
		}
		// Revert first the files that lose to a file which does not lose anything itself: their
		// fate is certain. Reverting them may resolve the other conflicts.
		var revert []string
		for name, ls := range losses {
			for _, x := range ls {
				if _, alsoLoses := losses[x.winner]; !alsoLoses {
					revert = append(revert, name)
					break
				}
			}
		}
		if len(revert) == 0 {
			for name := range losses {
				revert = append(revert, name)
			}
		}
		slices.Sort(revert)
		// The messages name the winners' objects in the content this round started from, so
		// they are all written before any file is reverted.
		for _, name := range revert {
			ls := losses[name]
			slices.SortFunc(ls, func(a, b loss) int {
				return cmp.Or(cmp.Compare(a.obj.doc, b.obj.doc), cmp.Compare(a.obj.item, b.obj.item))
			})
			for _, x := range ls {
				other := objectIn(x.obj.key, x.winner)
				kept := "this file is not applied"
				if l.files[name].good != nil {
					kept = "keeping this file's previous content"
				}
				winner := filepath.Join(l.dir, x.winner)
				errs[name] = append(errs[name], x.obj.loc(filepath.Join(l.dir, name)).errorf("duplicate %s: also defined in %s (%s); %s",
					x.obj.key, winner, other.loc(winner).docRef(), kept))
			}
		}
		for _, name := range revert {
			fresh[name] = false
			if g := l.files[name].good; g != nil {
				content[name] = g
			} else {
				delete(content, name)
			}
		}
	}
}

func compareErrors(a, b error) int {
	var ea, eb *Error
	okA, okB := errors.As(a, &ea), errors.As(b, &eb)
	if !okA || !okB {
		return 0
	}
	return cmp.Or(cmp.Compare(ea.File, eb.File), cmp.Compare(ea.Document, eb.Document), cmp.Compare(ea.Item, eb.Item))
}

// unwrapPathError drops the path from an *fs.PathError, for messages that name the path already.
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
