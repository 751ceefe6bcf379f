package lint

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/source/manifests"
)

// TestFixtures: each directory of testdata is a cluster with the mistakes the trackers report
// (default-deny egress that broke DNS, a typo in the DNS peer, label typos, named ports, rules
// never reached, priorities that collide, Deny over the nodes), and want.txt the findings, one
// "severity check object|field" a line: lint must find each (no miss) and nothing else.
func TestFixtures(t *testing.T) {
	dirs, err := filepath.Glob("testdata/*")
	if err != nil || len(dirs) < 8 {
		t.Fatalf("fixtures: %v %v", dirs, err)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			st, errs := manifests.Load(dir, nil)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			data, err := os.ReadFile(filepath.Join(dir, "want.txt"))
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				if l != "" {
					want = append(want, l)
				}
			}
			var got []string
			for _, f := range Run(st, DefaultOptions).Findings {
				got = append(got, fmt.Sprintf("%s %s %s|%s", f.Severity, f.Check, f.Object, f.Field))
				if f.Problem == "" || f.Why == "" || f.Fix == "" {
					t.Errorf("finding %+v lacks what, why or what to change", f)
				}
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("findings:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

// TestExamplesAreClean: the demo's cluster is written to be correct; lint finds nothing there.
func TestExamplesAreClean(t *testing.T) {
	st, errs := manifests.Load("../../examples/manifests", nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	r := Run(st, DefaultOptions)
	if len(r.Findings) > 0 {
		t.Errorf("findings on the examples: %v", r.Findings)
	}
}
