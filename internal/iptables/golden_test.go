package iptables

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -run %s -update rewrites it):\n%s", name, path, t.Name(), got)
	}
}

// TestNetworkPolicyOnlyUnchanged: a Ruleset without ClusterNetworkPolicy tiers renders exactly
// as it did before the tiers existed (the golden file was written by that renderer).
func TestNetworkPolicyOnlyUnchanged(t *testing.T) {
	rs, _ := policy.Compile(stateWithPods(20), "n1")
	golden(t, "networkpolicy-only.golden", Dump(Render(rs)))
}
