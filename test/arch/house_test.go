package arch

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/netwarden/netwarden/"

// deps lists what pkg links: every package it imports, directly or not.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// imports lists pkg's direct imports of our own packages, without the module prefix.
func imports(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	var ours []string
	for _, imp := range strings.Fields(string(out)) {
		if p, ok := strings.CutPrefix(imp, module); ok {
			ours = append(ours, p)
		}
	}
	return ours
}

// TestWireContractsAreLeaves: the packages that carry what crosses a process boundary (the
// gate's socket protocol, /status) or a feature's boundary (dataplane) import nothing of ours
// but what they carry, so that both sides of each can import them without pulling the other
// side in.
func TestWireContractsAreLeaves(t *testing.T) {
	allowed := map[string][]string{
		"internal/dataplane": nil,
		"internal/gateproto": nil,
		"internal/statusapi": {"internal/cluster", "internal/dataplane"},
	}
	for pkg, may := range allowed {
		for _, imp := range imports(t, pkg) {
			if !slices.Contains(may, imp) {
				t.Errorf("%s imports %s; a wire contract imports only %v of ours", pkg, imp, may)
			}
		}
	}
}

// TestWingsStayApart: the agent does not link the CNI plugins (nor containernetworking), and
// the test kits, which the demo ships, do not link the agent: they read it through /status.
func TestWingsStayApart(t *testing.T) {
	for _, d := range deps(t, "internal/agent") {
		if strings.HasPrefix(d, module+"internal/cni") || strings.Contains(d, "containernetworking") {
			t.Errorf("internal/agent links %s", d)
		}
	}
	out, err := exec.Command("go", "list", module+"internal/testkit/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, kit := range strings.Fields(string(out)) {
		if slices.Contains(deps(t, strings.TrimPrefix(kit, module)), module+"internal/agent") {
			t.Errorf("%s links internal/agent", kit)
		}
	}
}

// TestFilesByJob: no non-test Go file is over 600 lines; a longer one holds more than one job.
func TestFilesByJob(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, dir := range []string{"cmd", "internal", "test"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if n := bytes.Count(b, []byte("\n")); n > 600 {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s has %d lines (at most 600)", rel, n)
			}
			checked++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 100 {
		t.Fatalf("found only %d Go files", checked)
	}
}
