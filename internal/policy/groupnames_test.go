package policy

import (
	"slices"
	"testing"
)

func TestGroupNamesSurviveWholeGroupChanges(t *testing.T) {
	var gn groupNamer
	fresh := func(chains []string) string { return "grp-" + chains[len(chains)-1] }
	check := func(step string, byPod map[string][]string) map[string]string {
		t.Helper()
		ofPod, chainsOf := gn.assign(byPod, fresh)
		for pk, chains := range byPod {
			if got := chainsOf[ofPod[pk]]; !slices.Equal(got, chains) {
				t.Fatalf("%s: pod %s is in group %s of %v, want chains %v", step, pk, ofPod[pk], got, chains)
			}
		}
		return ofPod
	}

	first := check("first", map[string][]string{"a": {"X"}, "b": {"X"}, "c": {"X"}, "d": {"Y"}})
	if first["a"] != "grp-X" || first["d"] != "grp-Y" {
		t.Fatalf("first groups are named by their chains: %v", first)
	}

	// A policy now selects every pod: each group keeps its name, so only the group chains
	// change in the kernel, not the dispatch elements.
	second := check("cluster-wide policy added", map[string][]string{"a": {"Z", "X"}, "b": {"Z", "X"}, "c": {"Z", "X"}, "d": {"Z", "Y"}})
	for pk := range second {
		if second[pk] != first[pk] {
			t.Errorf("pod %s moved from group %s to %s", pk, first[pk], second[pk])
		}
	}

	// a leaves for chains whose fresh name the inherited group holds: it gets a new name.
	third := check("one pod leaves", map[string][]string{"a": {"X"}, "b": {"Z", "X"}, "c": {"Z", "X"}, "d": {"Z", "Y"}})
	if third["b"] != first["b"] || third["d"] != first["d"] {
		t.Errorf("the groups that kept most of their pods must keep their names: %v", third)
	}
	if third["a"] == third["b"] || third["a"] == "" {
		t.Errorf("a must get a group of its own, got %q (b is in %q)", third["a"], third["b"])
	}

	// Unchanged chains keep their names even when their pods change.
	fourth := check("pods swap", map[string][]string{"a": {"Z", "X"}, "b": {"X"}, "c": {"Z", "X"}, "d": {"Z", "Y"}})
	if fourth["a"] != third["b"] || fourth["b"] != third["a"] {
		t.Errorf("groups whose chains are unchanged keep their names: before %v, after %v", third, fourth)
	}
}
