package cluster

import (
	"encoding/json"
	"iter"
	"maps"
)

// FileHashes maps manifest file names to the hex SHA-256 of their content (see
// Revision.Files). A value never changes once made: With returns a new one that shares most of
// its entries with the old, a base map and a small overlay of the changes since, so that a
// change of one file of 16,000 does not copy 16,000 entries (1.3 MB) for the next snapshot.
// The zero value is empty.
type FileHashes struct {
	base map[string]string
	// over holds the changes since base: a hash, or "" for a file removed.
	over map[string]string
	n    int
}

// FileHashesOf returns the hashes of m, which it does not keep.
func FileHashesOf(m map[string]string) FileHashes {
	return FileHashes{base: maps.Clone(m), n: len(m)}
}

// Get returns the hash of file name.
func (f FileHashes) Get(name string) (string, bool) {
	if h, ok := f.over[name]; ok {
		return h, h != ""
	}
	h, ok := f.base[name]
	return h, ok
}

// Len is the number of files.
func (f FileHashes) Len() int { return f.n }

// IsZero reports whether there are no files (for the JSON encoding's omitzero).
func (f FileHashes) IsZero() bool { return f.n == 0 }

// All yields every file and its hash, in no order.
func (f FileHashes) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for name, h := range f.over {
			if h != "" && !yield(name, h) {
				return
			}
		}
		for name, h := range f.base {
			if _, changed := f.over[name]; !changed && !yield(name, h) {
				return
			}
		}
	}
}

// Map returns the hashes as a new map.
func (f FileHashes) Map() map[string]string {
	m := make(map[string]string, f.n)
	maps.Insert(m, f.All())
	return m
}

// Equal reports whether f and o hold the same hashes.
func (f FileHashes) Equal(o FileHashes) bool {
	if f.n != o.n {
		return false
	}
	for name, h := range f.All() {
		if oh, ok := o.Get(name); !ok || oh != h {
			return false
		}
	}
	return true
}

// With returns f with changes applied: name to hash, or "" to remove name. Each value copies
// the overlay; once the overlay holds more than sqrt(2 x base) files it is folded into a new
// base, the size at which copying it and folding it cost a change the same on average
// (about 180 entries of each at 16,000 files).
func (f FileHashes) With(changes map[string]string) FileHashes {
	if len(changes) == 0 {
		return f
	}
	out := FileHashes{base: f.base, over: make(map[string]string, len(f.over)+len(changes)), n: f.n}
	maps.Copy(out.over, f.over)
	for name, h := range changes {
		_, had := f.Get(name)
		switch {
		case h == "" && had:
			out.n--
		case h != "" && !had:
			out.n++
		}
		if _, inBase := f.base[name]; h == "" && !inBase {
			delete(out.over, name) // nothing to hide
		} else {
			out.over[name] = h
		}
	}
	if k := len(out.over); k > 32 && k*k > 2*len(out.base) {
		return FileHashes{base: out.Map(), n: out.n}
	}
	return out
}

// MarshalJSON writes the hashes as one object, file name to hash.
func (f FileHashes) MarshalJSON() ([]byte, error) { return json.Marshal(f.Map()) }

// UnmarshalJSON reads what MarshalJSON writes.
func (f *FileHashes) UnmarshalJSON(data []byte) error {
	var m map[string]string
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*f = FileHashes{base: m, n: len(m)}
	return nil
}
