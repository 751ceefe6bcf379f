package cluster

import (
	"maps"
	"strconv"
)

// Revision says which writes a snapshot of cluster state contains, in terms the writer can
// check without knowing the agent's internal numbering: the content of each manifest file it
// read, or the resourceVersion each API watch has reached. A test (or an operator) that wrote a
// file or an object waits until the applied Revision covers the write, instead of guessing from
// log lines or sleeping. A Revision's maps are never modified once it is in a State.
type Revision struct {
	// Files maps each manifest file read (by base name) to the hex SHA-256 of the bytes read,
	// whether or not they were valid: a file with problems keeps its last good objects, and
	// its entry still says that this content was seen.
	Files FileHashes `json:"files,omitzero"`
	// ResourceVersions maps each watched resource (namespaces, pods, networkpolicies, nodes,
	// clusternetworkpolicies) to the highest resourceVersion among the events delivered so far.
	// A watch delivers its events in resourceVersion order, so every write of that resource up
	// to this version is contained.
	ResourceVersions map[string]uint64 `json:"resourceVersions,omitempty"`
}

// Equal reports whether r and o name the same content.
func (r Revision) Equal(o Revision) bool {
	return r.Files.Equal(o.Files) && maps.Equal(r.ResourceVersions, o.ResourceVersions)
}

// Covers reports whether r contains a write of resource at resourceVersion rv.
func (r Revision) Covers(resource string, rv uint64) bool { return r.ResourceVersions[resource] >= rv }

// ParseResourceVersion reads an object's resourceVersion. The API server's versions are etcd
// revisions, which only grow; 0 means none (or one we cannot compare, which is then ignored).
func ParseResourceVersion(rv string) uint64 {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Only returns the part of r about the named files and resources, for a caller that asks about
// a few of thousands. Each list trims its own half: a nil one keeps all of that half.
func (r Revision) Only(files, resources []string) Revision {
	out := r
	if files != nil {
		found := map[string]string{}
		for _, f := range files {
			if h, ok := r.Files.Get(f); ok {
				found[f] = h
			}
		}
		out.Files = FileHashesOf(found)
	}
	if resources != nil {
		out.ResourceVersions = nil
		for _, res := range resources {
			if out.ResourceVersions == nil {
				out.ResourceVersions = map[string]uint64{}
			}
			if v, ok := r.ResourceVersions[res]; ok {
				out.ResourceVersions[res] = v
			}
		}
	}
	return out
}
