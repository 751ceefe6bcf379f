// Package manifests provides cluster state read from a directory of Kubernetes manifest files, for
// running the agent without an API server (netwarden agent --manifests DIR).
//
// Every *.yaml, *.yml and *.json file directly in the directory is read (names starting with "."
// are ignored; symlinks are followed). A file may hold several YAML documents and List objects.
// Namespaces, Pods, NetworkPolicies (networking.k8s.io/v1) and Nodes are used; other kinds are
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
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Load reads dir once. It returns the state built from every good file, and one error per problem
// (file + document + field); the errors are *Error values except for the directory itself. If dir
// cannot be read, the state is nil and the single error names dir.
func Load(dir string, logger *slog.Logger) (*cluster.State, []error) {
	l := newLoader(dir, orDiscard(logger))
	res, err := l.load()
	if err != nil {
		return nil, []error{err}
	}
	return res.state, res.errs
}

func orDiscard(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return logger
}

// loader reads the directory and keeps what is needed for the last-good-content behaviour across
// reloads. It is not safe for concurrent use.
type loader struct {
	dir    string
	logger *slog.Logger
	// parsed caches the latest parse of each file, so unchanged files are not re-parsed (and
	// skipped kinds are not logged again on every reload).
	parsed map[string]*fileContent
	// good is the content of each file that is in effect: its last content without problems.
	good map[string]*fileContent
	// owner is the file each object of the current state comes from.
	owner map[objKey]string
}

func newLoader(dir string, logger *slog.Logger) *loader {
	return &loader{dir: dir, logger: logger, parsed: map[string]*fileContent{}, good: map[string]*fileContent{}, owner: map[objKey]string{}}
}

type loadResult struct {
	state *cluster.State
	sum   [sha256.Size]byte // content hash of the state's objects
	errs  []error
	files int // files in effect
	// read maps every manifest file read to the hex SHA-256 of its bytes, good or not.
	read map[string]string
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

// load reads the directory and computes the new state. The error is for the directory itself;
// problems with files are in the result.
func (l *loader) load() (*loadResult, error) {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("reading manifests directory %s: %w", l.dir, unwrapPathError(err))
	}
	var errs []error
	parsed := map[string]*fileContent{}
	var present []string       // manifest files that exist, sorted (ReadDir sorts by name)
	fresh := map[string]bool{} // files whose current content is good
	content := map[string]*fileContent{}
	read := map[string]string{}
	for _, e := range entries {
		ok, isJSON := manifestFile(e.Name())
		if !ok {
			continue
		}
		name := e.Name()
		path := filepath.Join(l.dir, name)
		info, err := os.Stat(path) // follows symlinks
		if err != nil {
			if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
				continue // removed since the directory was listed
			}
			present = append(present, name)
			errs = append(errs, &Error{File: path, Item: -1, Err: unwrapPathError(err)})
			continue
		}
		if !info.Mode().IsRegular() {
			l.logger.Debug("ignoring manifest path that is not a regular file", "path", path, "mode", info.Mode().String())
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			present = append(present, name)
			errs = append(errs, &Error{File: path, Item: -1, Err: unwrapPathError(err)})
			continue
		}
		present = append(present, name)
		fc := l.parsed[name]
		if sum := sha256.Sum256(data); fc == nil || fc.sum != sum {
			fc = parseFile(path, name, data, isJSON, l.logger)
			fc.hex = hex.EncodeToString(sum[:])
		}
		parsed[name] = fc
		read[name] = fc.hex
		if len(fc.errs) > 0 {
			errs = append(errs, fc.errs...)
			continue
		}
		fresh[name] = true
		content[name] = fc
	}
	l.parsed = parsed

	// Files with problems keep their last good content.
	for _, name := range present {
		if !fresh[name] {
			if g := l.good[name]; g != nil {
				content[name] = g
			}
		}
	}
	errs = append(errs, l.resolveDuplicates(present, content, fresh)...)

	good := map[string]*fileContent{}
	owner := map[objKey]string{}
	st := cluster.NewState()
	var objs []*object
	for _, name := range present {
		fc := content[name]
		if fc == nil {
			continue
		}
		good[name] = fc
		for _, o := range fc.objects {
			owner[o.key] = name
			objs = append(objs, o)
			k := cluster.Key(o.key.ns, o.key.name)
			switch obj := o.obj.(type) {
			case *corev1.Namespace:
				st.Namespaces[o.key.name] = obj
			case *corev1.Node:
				st.Nodes[o.key.name] = obj
			case *corev1.Pod:
				st.Pods[k] = obj
			case *networkingv1.NetworkPolicy:
				st.Policies[k] = obj
			}
		}
	}
	l.good, l.owner = good, owner

	slices.SortStableFunc(errs, compareErrors)
	st.Revision = cluster.Revision{Files: read}
	return &loadResult{state: st, sum: stateSum(objs), errs: errs, files: len(good), read: read}, nil
}

// resolveDuplicates finds objects defined in more than one file. The file that defined the object
// in the previous state keeps it (or, when none did, the lexically first file); a file with new
// content that loses an object is treated like a broken file: it keeps its last good content.
// content is updated in place.
func (l *loader) resolveDuplicates(files []string, content map[string]*fileContent, fresh map[string]bool) []error {
	type loss struct {
		obj    *object
		winner string
	}
	var errs []error
	for {
		providers := map[objKey][]string{}
		where := map[objKey]map[string]*object{}
		for _, name := range files {
			fc := content[name]
			if fc == nil {
				continue
			}
			for _, o := range fc.objects {
				providers[o.key] = append(providers[o.key], name)
				if where[o.key] == nil {
					where[o.key] = map[string]*object{}
				}
				where[o.key][name] = o
			}
		}
		losses := map[string][]loss{}
		for key, names := range providers {
			if len(names) < 2 {
				continue
			}
			winner := names[0]
			if prev, ok := l.owner[key]; ok && slices.Contains(names, prev) {
				winner = prev
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
				losses[name] = append(losses[name], loss{obj: where[key][name], winner: winner})
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
		for _, name := range revert {
			ls := losses[name]
			slices.SortFunc(ls, func(a, b loss) int {
				return cmp.Or(cmp.Compare(a.obj.loc.doc, b.obj.loc.doc), cmp.Compare(a.obj.loc.item, b.obj.loc.item))
			})
			for _, x := range ls {
				other := where[x.obj.key][x.winner]
				kept := "this file is not applied"
				if l.good[name] != nil {
					kept = "keeping this file's previous content"
				}
				errs = append(errs, x.obj.loc.errorf("duplicate %s: also defined in %s (%s); %s",
					x.obj.key, filepath.Join(l.dir, x.winner), other.loc.docRef(), kept))
			}
			fresh[name] = false
			if g := l.good[name]; g != nil {
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

// stateSum hashes the objects of a state, independently of the files they come from.
func stateSum(objs []*object) [sha256.Size]byte {
	sorted := slices.Clone(objs)
	slices.SortFunc(sorted, func(a, b *object) int {
		return cmp.Or(cmp.Compare(a.key.kind, b.key.kind), cmp.Compare(a.key.ns, b.key.ns), cmp.Compare(a.key.name, b.key.name))
	})
	h := sha256.New()
	for _, o := range sorted {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00", o.key.kind, o.key.ns, o.key.name)
		h.Write(o.sum[:])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// unwrapPathError drops the path from an *fs.PathError, for messages that name the path already.
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
