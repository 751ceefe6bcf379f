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
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"

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
		o, _ := obj.(*cluster.Pod)
		l.objects.SetPod(key.id, o)
	case objPolicy:
		o, _ := obj.(*networkingv1.NetworkPolicy)
		l.objects.SetPolicy(key.id, o)
	case objCNP:
		o, _ := obj.(*npav1beta1.ClusterNetworkPolicy)
		l.objects.SetClusterPolicy(key.id, o)
	}
}
