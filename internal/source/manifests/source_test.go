package manifests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/cluster"
)

// step is one change of the directory followed by a reload.
type step struct {
	name     string
	write    map[string]string
	remove   []string
	want     []string // object keys after the reload
	wantErrs []string // error substrings, in order; DIR is the directory
	notify   bool     // whether the reload must notify: new content was read
	// sameObjects: the new content leaves every object as it was (the file was rewritten
	// equivalently, or its problems keep its last good content): only the Revision moves.
	sameObjects bool
}

// runSteps runs the steps twice: reading the whole directory at each step, and reading only the
// files each step writes or removes, as the events of those files ask. Both must agree.
func runSteps(t *testing.T, steps []step) {
	t.Helper()
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole directory", true: "named files"}[named], func(t *testing.T) {
			runStepsOnce(t, steps, named)
		})
	}
}

func runStepsOnce(t *testing.T, steps []step, named bool) {
	t.Helper()
	dir := t.TempDir()
	s := New(dir, nil)
	var notified int
	for i, st := range steps {
		writeFiles(t, dir, st.write)
		for _, name := range st.remove {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		before := s.Snapshot()
		beforeKeys := keys(before)
		all := !named || i == 0
		names := append(slices.Collect(maps.Keys(st.write)), st.remove...)
		if err := s.update(names, all, func() { notified++ }); err != nil {
			t.Fatalf("step %d (%s): %v", i, st.name, err)
		}
		checkErrors(t, dir, s.Errors(), st.wantErrs)
		if got := keys(s.Snapshot()); !slices.Equal(got, st.want) {
			t.Errorf("step %d (%s): objects:\n got  %q\n want %q", i, st.name, got, st.want)
		}
		if notified != 0 != st.notify {
			t.Errorf("step %d (%s): notified %d times, want notify=%v", i, st.name, notified, st.notify)
		}
		if st.notify == (s.Snapshot() == before) {
			t.Errorf("step %d (%s): a new state must be published exactly when notifying", i, st.name)
		}
		if st.sameObjects {
			ch := s.Snapshot().Changes
			if ch == nil || len(ch.Namespaces)+len(ch.Pods)+len(ch.Policies)+len(ch.Nodes)+len(ch.ClusterPolicies) != 0 {
				t.Errorf("step %d (%s): objects changed: %+v", i, st.name, ch)
			}
		}
		checkRevision(t, dir, s.Snapshot().Revision, fmt.Sprintf("step %d (%s)", i, st.name))
		if got := keys(before); !slices.Equal(got, beforeKeys) {
			t.Errorf("step %d (%s): previous snapshot was modified: %q -> %q", i, st.name, beforeKeys, got)
		}
		notified = 0
	}
}

// checkRevision checks that rev names the content of every manifest file in dir as read.
func checkRevision(t *testing.T, dir string, rev cluster.Revision, where string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, e := range entries {
		if ok, _ := manifestFile(e.Name()); !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		want[e.Name()] = hex.EncodeToString(sum[:])
	}
	if !maps.Equal(rev.Files.Map(), want) {
		t.Errorf("%s: Revision.Files %v, want %v", where, rev.Files.Map(), want)
	}
}

func TestReloadLastGood(t *testing.T) {
	broken := policy("foo", "p9") + "---\n" + strings.Replace(policyAllowWeb, "port: 80", "port: 70000", 1)
	runSteps(t, []step{
		{
			name:   "first load",
			write:  map[string]string{"a.yaml": policy("foo", "p1") + "---\n" + policy("foo", "p2"), "b.yaml": nsFoo},
			want:   []string{"Namespace foo", "NetworkPolicy foo/p1", "NetworkPolicy foo/p2"},
			notify: true,
		},
		{
			name: "no change does not notify",
			want: []string{"Namespace foo", "NetworkPolicy foo/p1", "NetworkPolicy foo/p2"},
		},
		{
			name:        "rewriting a file with equivalent content publishes its Revision, changing no object",
			write:       map[string]string{"b.yaml": "# same namespace, other formatting\n" + `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "foo", "labels": {"team": "a"}}}`},
			want:        []string{"Namespace foo", "NetworkPolicy foo/p1", "NetworkPolicy foo/p2"},
			notify:      true,
			sameObjects: true,
		},
		{
			name:     "breaking a file keeps its previous objects while other files change",
			write:    map[string]string{"a.yaml": broken, "c.yaml": nodeOne},
			want:     []string{"Namespace foo", "NetworkPolicy foo/p1", "NetworkPolicy foo/p2", "Node node-1"},
			wantErrs: []string{"DIR/a.yaml: document 2 (NetworkPolicy default/allow-web): spec.ingress[0].ports[0].port: Invalid value: 70000"},
			notify:   true,
		},
		{
			name:     "still broken, nothing else changes",
			want:     []string{"Namespace foo", "NetworkPolicy foo/p1", "NetworkPolicy foo/p2", "Node node-1"},
			wantErrs: []string{"DIR/a.yaml: document 2 (NetworkPolicy default/allow-web): spec.ingress[0].ports[0].port: Invalid value: 70000"},
		},
		{
			name:        "a different break in the same file still keeps the last good content",
			write:       map[string]string{"a.yaml": "kind: [\n"},
			want:        []string{"Namespace foo", "NetworkPolicy foo/p1", "NetworkPolicy foo/p2", "Node node-1"},
			wantErrs:    []string{"DIR/a.yaml: document 1: invalid YAML"},
			notify:      true,
			sameObjects: true,
		},
		{
			name:   "fixing the file applies its new content",
			write:  map[string]string{"a.yaml": policy("foo", "p9") + "---\n" + policyAllowWeb},
			want:   []string{"Namespace foo", "NetworkPolicy default/allow-web", "NetworkPolicy foo/p9", "Node node-1"},
			notify: true,
		},
		{
			name:   "deleting a file removes its objects",
			remove: []string{"c.yaml"},
			want:   []string{"Namespace foo", "NetworkPolicy default/allow-web", "NetworkPolicy foo/p9"},
			notify: true,
		},
		{
			name:        "breaking then deleting a file removes its objects",
			write:       map[string]string{"b.yaml": "apiVersion: v1\nkind: Namespace\n"},
			want:        []string{"Namespace foo", "NetworkPolicy default/allow-web", "NetworkPolicy foo/p9"},
			wantErrs:    []string{"DIR/b.yaml: document 1 (Namespace): metadata.name: Required value"},
			notify:      true,
			sameObjects: true,
		},
		{
			name:   "deleted",
			remove: []string{"b.yaml"},
			want:   []string{"NetworkPolicy default/allow-web", "NetworkPolicy foo/p9"},
			notify: true,
		},
		{
			name:        "a new broken file contributes nothing",
			write:       map[string]string{"d.yaml": policy("foo", "new") + "---\nkind: Pod\n"},
			want:        []string{"NetworkPolicy default/allow-web", "NetworkPolicy foo/p9"},
			wantErrs:    []string{"DIR/d.yaml: document 2 (Pod): apiVersion: Required value"},
			notify:      true,
			sameObjects: true,
		},
	})
}

func TestReloadDuplicates(t *testing.T) {
	runSteps(t, []step{
		{
			name:   "first load",
			write:  map[string]string{"a.yaml": policy("foo", "x"), "b.yaml": policy("foo", "z")},
			want:   []string{"NetworkPolicy foo/x", "NetworkPolicy foo/z"},
			notify: true,
		},
		{
			name:  "a file that adds a duplicate keeps its previous content",
			write: map[string]string{"b.yaml": policy("foo", "z") + "---\n" + policy("foo", "yy") + "---\n" + policy("foo", "x")},
			want:  []string{"NetworkPolicy foo/x", "NetworkPolicy foo/z"},
			wantErrs: []string{
				"DIR/b.yaml: document 3 (NetworkPolicy foo/x): duplicate NetworkPolicy foo/x: also defined in DIR/a.yaml (document 1); keeping this file's previous content",
			},
			notify:      true,
			sameObjects: true,
		},
		{
			name:        "the previous owner wins even if lexically later",
			write:       map[string]string{"0.yaml": policy("foo", "z") + "---\n" + policy("foo", "w")},
			want:        []string{"NetworkPolicy foo/x", "NetworkPolicy foo/z"},
			wantErrs:    []string{"DIR/0.yaml: document 1 (NetworkPolicy foo/z): duplicate NetworkPolicy foo/z: also defined in DIR/b.yaml (document 1); this file is not applied", "DIR/b.yaml: document 3"},
			notify:      true,
			sameObjects: true,
		},
		{
			name:     "removing the duplicate from a applies b",
			write:    map[string]string{"a.yaml": "", "0.yaml": policy("foo", "w")},
			want:     []string{"NetworkPolicy foo/w", "NetworkPolicy foo/x", "NetworkPolicy foo/yy", "NetworkPolicy foo/z"},
			notify:   true,
			wantErrs: nil,
		},
		{
			name:        "moving an object between files in one change is fine",
			write:       map[string]string{"0.yaml": policy("foo", "w") + "---\n" + policy("foo", "x"), "b.yaml": policy("foo", "z") + "---\n" + policy("foo", "yy")},
			want:        []string{"NetworkPolicy foo/w", "NetworkPolicy foo/x", "NetworkPolicy foo/yy", "NetworkPolicy foo/z"},
			notify:      true, // same objects, different files: only the Revision moves
			sameObjects: true,
		},
	})
}

func TestReloadDuplicateCascade(t *testing.T) {
	// a defines X; b defines X and Y; c defines Y. b loses X to a, so c's Y is no duplicate.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": policy("foo", "x"),
		"b.yaml": policy("foo", "x") + "---\n" + policy("foo", "yy"),
		"c.yaml": policy("foo", "yy"),
	})
	st, errs := Load(dir, nil)
	checkErrors(t, dir, errs, []string{"DIR/b.yaml: document 1 (NetworkPolicy foo/x): duplicate NetworkPolicy foo/x: also defined in DIR/a.yaml"})
	if got, want := keys(st), []string{"NetworkPolicy foo/x", "NetworkPolicy foo/yy"}; !slices.Equal(got, want) {
		t.Errorf("objects: got %q, want %q", got, want)
	}
}

// run starts s.Run and returns a channel that receives on each notify.
func run(t *testing.T, s *Source) (<-chan struct{}, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	notified := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func() { notified <- struct{}{} }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Run did not return")
		}
	})
	return notified, done
}

// waitFor waits for a notification after which the state has the wanted objects.
func waitFor(t *testing.T, s *Source, notified <-chan struct{}, want []string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-notified:
			if slices.Equal(keys(s.Snapshot()), want) {
				return
			}
		case <-deadline:
			t.Fatalf("timeout waiting for %q; state has %q; errors %v", want, keys(s.Snapshot()), s.Errors())
		}
	}
}

func TestRunWatches(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "a"), "bad.yaml": "kind: ["})
	s := New(dir, nil)
	if s.HasSynced() {
		t.Fatal("synced before Run")
	}
	if got := keys(s.Snapshot()); len(got) != 0 {
		t.Fatalf("snapshot before Run: %q", got)
	}
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"NetworkPolicy foo/a"})
	if !s.HasSynced() {
		t.Error("not synced after the first load")
	}
	if len(s.Errors()) != 1 {
		t.Errorf("errors: %v", s.Errors())
	}

	t.Run("new file", func(t *testing.T) {
		writeFiles(t, dir, map[string]string{"b.yaml": policy("foo", "b")})
		waitFor(t, s, notified, []string{"NetworkPolicy foo/a", "NetworkPolicy foo/b"})
	})
	t.Run("rename over (atomic save)", func(t *testing.T) {
		writeFiles(t, dir, map[string]string{".b.yaml.tmp": policy("foo", "b2")})
		if err := os.Rename(filepath.Join(dir, ".b.yaml.tmp"), filepath.Join(dir, "b.yaml")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, s, notified, []string{"NetworkPolicy foo/a", "NetworkPolicy foo/b2"})
	})
	t.Run("fix broken file", func(t *testing.T) {
		writeFiles(t, dir, map[string]string{"bad.yaml": nsFoo})
		waitFor(t, s, notified, []string{"Namespace foo", "NetworkPolicy foo/a", "NetworkPolicy foo/b2"})
		if len(s.Errors()) != 0 {
			t.Errorf("errors: %v", s.Errors())
		}
	})
	t.Run("remove", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, s, notified, []string{"Namespace foo", "NetworkPolicy foo/b2"})
	})
	t.Run("rename away", func(t *testing.T) {
		if err := os.Rename(filepath.Join(dir, "b.yaml"), filepath.Join(dir, "b.yaml.disabled")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, s, notified, []string{"Namespace foo"})
	})
}

func TestRunConfigMapSymlinkSwap(t *testing.T) {
	// The layout of a ConfigMap volume: visible names are symlinks through "..data", which is
	// itself a symlink to a timestamped directory that is replaced atomically on update.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"..2024_01_01/policies.yaml": policy("foo", "v1")})
	mustSymlink(t, "..2024_01_01", filepath.Join(dir, "..data"))
	mustSymlink(t, "..data/policies.yaml", filepath.Join(dir, "policies.yaml"))

	s := New(dir, nil)
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"NetworkPolicy foo/v1"})

	writeFiles(t, dir, map[string]string{"..2024_01_02/policies.yaml": policy("foo", "v2")})
	mustSymlink(t, "..2024_01_02", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2024_01_01")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, notified, []string{"NetworkPolicy foo/v2"})
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestRunDebouncesBursts(t *testing.T) {
	dir := t.TempDir()
	s := New(dir, nil)
	s.debounce = 200 * time.Millisecond
	var calls atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func() { calls.Add(1) }) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, s.HasSynced)
	for i := range 5 {
		writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "p"+string(rune('0'+i)))})
		time.Sleep(10 * time.Millisecond)
	}
	waitUntil(t, func() bool { return slices.Equal(keys(s.Snapshot()), []string{"NetworkPolicy foo/p4"}) })
	time.Sleep(300 * time.Millisecond)
	if n := calls.Load(); n != 2 { // first load + one debounced reload
		t.Errorf("notify called %d times, want 2", n)
	}
}

func TestRunPeriodicResync(t *testing.T) {
	dir := t.TempDir()
	s := New(dir, nil)
	s.debounce, s.maxDebounce = time.Hour, time.Hour // events never trigger a reload
	s.resync = 50 * time.Millisecond
	notified, _ := run(t, s)
	waitFor(t, s, notified, nil)
	writeFiles(t, dir, map[string]string{"a.yaml": nsFoo})
	waitFor(t, s, notified, []string{"Namespace foo"})
}

func TestRunDirectoryRemovedAndRecreated(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "m")
	writeFiles(t, dir, map[string]string{"a.yaml": nsFoo})
	s := New(dir, nil)
	s.resync = 50 * time.Millisecond
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"Namespace foo"})

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		errs := s.Errors()
		return len(errs) == 1 && strings.Contains(errs[0].Error(), dir)
	})
	if got := keys(s.Snapshot()); !slices.Equal(got, []string{"Namespace foo"}) {
		t.Errorf("state after the directory went away: %q", got)
	}
	writeFiles(t, dir, map[string]string{"b.yaml": nodeOne})
	waitFor(t, s, notified, []string{"Node node-1"})
	writeFiles(t, dir, map[string]string{"c.yaml": nsFoo})
	waitFor(t, s, notified, []string{"Namespace foo", "Node node-1"})
}

func TestRunMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	s := New(dir, nil)
	err := s.Run(context.Background(), func() {})
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Run: %v", err)
	}
	if s.HasSynced() {
		t.Error("synced")
	}
}

func TestRunTwice(t *testing.T) {
	s := New(t.TempDir(), nil)
	notified, _ := run(t, s)
	waitFor(t, s, notified, nil)
	if err := s.Run(context.Background(), func() {}); err == nil {
		t.Error("second Run did not fail")
	}
}

func TestSourceImplementsInterface(t *testing.T) {
	var _ cluster.Source = New(t.TempDir(), nil)
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timeout")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunReadsOnlyTheNamedFile(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "a"), "b.yaml": policy("foo", "b")})
	s := New(dir, nil)
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"NetworkPolicy foo/a", "NetworkPolicy foo/b"})
	s.mu.Lock()
	b := s.loader.files["b.yaml"]
	s.mu.Unlock()

	writeFiles(t, dir, map[string]string{".a.yaml.swp": "kind: ["}) // an editor's dot file: not read
	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "a2")})
	waitFor(t, s, notified, []string{"NetworkPolicy foo/a2", "NetworkPolicy foo/b"})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loader.files["b.yaml"] != b {
		t.Error("b.yaml was read again for an event on a.yaml")
	}
	if len(s.errs) != 0 {
		t.Errorf("errors: %v", s.errs)
	}
}

func TestRunMaxDebounce(t *testing.T) {
	dir := t.TempDir()
	s := New(dir, nil)
	// Events come more often than the quiet time: only the bound makes them read.
	s.debounce, s.maxDebounce = time.Hour, 20*time.Millisecond
	notified, _ := run(t, s)
	waitFor(t, s, notified, nil)
	stop := make(chan struct{})
	wrote := make(chan struct{})
	// Written in place, which waits for the events to settle (a file renamed in is read at
	// once), and without truncating: every version has the same length, so that any read finds
	// one policy.
	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "p0000")})
	f, err := os.OpenFile(filepath.Join(dir, "a.yaml"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	go func() {
		defer close(wrote)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := f.WriteAt([]byte(policy("foo", fmt.Sprintf("p%04d", i%10000))), 0); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond) // the pace of the burst, not a wait for anything
		}
	}()
	select {
	case <-notified:
	case <-time.After(5 * time.Second):
		t.Error("no read while events kept coming")
	}
	close(stop)
	<-wrote
	if got := keys(s.Snapshot()); len(got) != 1 {
		t.Errorf("objects: %q", got)
	}
}

func TestStaleFindsChangedFiles(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": nsFoo, "b.yaml": nodeOne, "c.yaml": policy("foo", "c"), "x.txt": "not read"})
	old := time.Now().Add(-time.Hour)
	for _, name := range []string{"a.yaml", "b.yaml", "c.yaml"} {
		if err := os.Chtimes(filepath.Join(dir, name), old, old); err != nil {
			t.Fatal(err)
		}
	}
	s := New(dir, nil)
	if err := s.reload(nil); err != nil {
		t.Fatal(err)
	}
	stale := func() []string {
		t.Helper()
		scan, err := scanDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		names := s.loader.stale(scan)
		slices.Sort(names)
		return names
	}
	if got := stale(); len(got) != 0 {
		t.Errorf("unchanged directory: stale %q", got)
	}
	writeFiles(t, dir, map[string]string{"b.yaml": nodeOne + "# edited\n", "d.yaml": nsFoo})
	if err := os.Remove(filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "a.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := stale(), []string{"a.yaml", "b.yaml", "c.yaml", "d.yaml"}; !slices.Equal(got, want) {
		t.Errorf("stale %q, want %q", got, want)
	}
	if err := s.update(stale(), false, nil); err != nil {
		t.Fatal(err)
	}
	checkRevision(t, dir, s.Snapshot().Revision, "after reading the stale files")
	// d.yaml duplicates a.yaml's namespace, and a.yaml keeps it.
	checkErrors(t, dir, s.Errors(), []string{"DIR/d.yaml: document 1 (Namespace foo): duplicate Namespace foo: also defined in DIR/a.yaml (document 1); this file is not applied"})
	// Written a moment ago: a change within the file system's timestamp granularity would
	// leave the same stat, so these are read again until they are old enough.
	if got, want := stale(), []string{"b.yaml", "d.yaml"}; !slices.Equal(got, want) {
		t.Errorf("recently written: stale %q, want %q", got, want)
	}
}

func TestRunDotSymlinkSwap(t *testing.T) {
	// As a ConfigMap volume, with a dot-named symlink that is not "..data".
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{".v1/policies.yaml": policy("foo", "v1"), ".v2/policies.yaml": policy("foo", "v2")})
	mustSymlink(t, ".v1", filepath.Join(dir, ".current"))
	mustSymlink(t, ".current/policies.yaml", filepath.Join(dir, "policies.yaml"))

	s := New(dir, nil)
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"NetworkPolicy foo/v1"})

	mustSymlink(t, ".v2", filepath.Join(dir, ".current.tmp"))
	if err := os.Rename(filepath.Join(dir, ".current.tmp"), filepath.Join(dir, ".current")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, notified, []string{"NetworkPolicy foo/v2"})
	// The previous target goes away: the content in effect does not change.
	if err := os.RemoveAll(filepath.Join(dir, ".v1")); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{"b.yaml": nsFoo})
	waitFor(t, s, notified, []string{"Namespace foo", "NetworkPolicy foo/v2"})
}

// TestRunReadsRenamedFilesAtOnce checks that a file renamed into the directory (written beside
// it and renamed over it, an atomic replace) is read at once, even while a file written in
// place waits for its events to settle, and that the file written in place is read once they
// have.
func TestRunReadsRenamedFilesAtOnce(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "a"), "b.yaml": policy("foo", "b")})
	s := New(dir, nil)
	s.debounce, s.maxDebounce = time.Hour, time.Hour // only a rename is read before the hour
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"NetworkPolicy foo/a", "NetworkPolicy foo/b"})

	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "a2")}) // in place
	writeFiles(t, dir, map[string]string{".b.yaml.tmp": policy("foo", "b2")})
	if err := os.Rename(filepath.Join(dir, ".b.yaml.tmp"), filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, notified, []string{"NetworkPolicy foo/a", "NetworkPolicy foo/b2"})
	checkRevisionOf(t, s, "b.yaml", policy("foo", "b2"))

	// A rename over a file written in place since reads the renamed content at once.
	writeFiles(t, dir, map[string]string{".a.yaml.tmp": policy("foo", "a3")})
	if err := os.Rename(filepath.Join(dir, ".a.yaml.tmp"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, notified, []string{"NetworkPolicy foo/a3", "NetworkPolicy foo/b2"})

	// With the usual quiet time, a file written in place is read once its events settle.
	s2 := New(dir, nil)
	notified2, _ := run(t, s2)
	waitFor(t, s2, notified2, []string{"NetworkPolicy foo/a3", "NetworkPolicy foo/b2"})
	writeFiles(t, dir, map[string]string{"a.yaml": policy("foo", "a4")})
	waitFor(t, s2, notified2, []string{"NetworkPolicy foo/a4", "NetworkPolicy foo/b2"})
}

// checkRevisionOf checks that the source's snapshot says file name was read with content.
func checkRevisionOf(t *testing.T, s *Source, name, content string) {
	t.Helper()
	sum := sha256.Sum256([]byte(content))
	if got, _ := s.Snapshot().Revision.Files.Get(name); got != hex.EncodeToString(sum[:]) {
		t.Errorf("revision of %s: %q, want the hash of its content", name, got)
	}
}
