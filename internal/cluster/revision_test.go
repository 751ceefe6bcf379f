package cluster

import (
	"maps"
	"testing"
)

// TestRevisionOnly checks that each list given to Only trims its own half of the Revision: a
// caller asking about its files still sees every resourceVersion, and the other way round.
func TestRevisionOnly(t *testing.T) {
	r := Revision{Files: FileHashesOf(map[string]string{"a.yaml": "1", "b.yaml": "2"}),
		ResourceVersions: map[string]uint64{"pods": 5, "nodes": 7}}
	for _, c := range []struct {
		name             string
		files, resources []string
		wantFiles        map[string]string
		wantRVs          map[string]uint64
	}{
		{"files", []string{"a.yaml", "gone.yaml"}, nil, map[string]string{"a.yaml": "1"}, map[string]uint64{"pods": 5, "nodes": 7}},
		{"no file", []string{""}, nil, map[string]string{}, map[string]uint64{"pods": 5, "nodes": 7}},
		{"resources", nil, []string{"nodes", "clusternetworkpolicies"}, map[string]string{"a.yaml": "1", "b.yaml": "2"}, map[string]uint64{"nodes": 7}},
		{"both", []string{"b.yaml"}, []string{"pods"}, map[string]string{"b.yaml": "2"}, map[string]uint64{"pods": 5}},
	} {
		got := r.Only(c.files, c.resources)
		if files := got.Files.Map(); !maps.Equal(files, c.wantFiles) && (len(files) != 0 || len(c.wantFiles) != 0) {
			t.Errorf("%s: files %v, want %v", c.name, files, c.wantFiles)
		}
		if !maps.Equal(got.ResourceVersions, c.wantRVs) {
			t.Errorf("%s: resourceVersions %v, want %v", c.name, got.ResourceVersions, c.wantRVs)
		}
	}
	if len(r.Files.Map()) != 2 || len(r.ResourceVersions) != 2 {
		t.Errorf("Only changed the Revision it trims: %+v", r)
	}
}
