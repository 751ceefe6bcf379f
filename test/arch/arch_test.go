package arch

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBinariesDoNotLinkTesting: the binaries under cmd/ link no test code. The demo
// uses the network-namespace test bed and simnode, so those must stay free of package testing;
// what tests share that needs it lives in internal/testkit/kerneltest.
func TestShippedBinariesDoNotLinkTesting(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", "github.com/netwarden/netwarden/cmd/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	cmds := strings.Fields(string(out))
	if len(cmds) < 5 {
		t.Fatalf("found only %d commands under cmd/: %v", len(cmds), cmds)
	}
	for _, cmd := range cmds {
		deps, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", cmd, err)
		}
		for _, line := range strings.Split(string(deps), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			for _, imp := range f[1:] {
				if imp == "testing" {
					t.Errorf("%s links %s, which imports testing", cmd, f[0])
				}
			}
		}
	}
}
