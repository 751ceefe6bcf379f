package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"iter"
	"maps"
	"slices"
	"strings"
)

// FileHashes maps manifest file names to the hex SHA-256 of their content (see
// Revision.Files). A value never changes once made: With returns a new one that shares most of
// its entries with the old, a base and a small overlay of the changes since, so that a change of
// one file of 16,000 does not copy 16,000 entries (1.3 MB) for the next snapshot. The base is a
// sorted array of names and binary hashes, as the agent holds one for as long as it runs: 48
// bytes a file, where a map of hex strings takes about 140. The zero value is empty.
type FileHashes struct {
	// base is sorted by name and never written once made.
	base []fileHash
	// text holds the hashes of base that are not a hex SHA-256 as given (no source makes such,
	// but FileHashes takes any string); their fileHash.sum is unused.
	text map[string]string
	// over holds the changes since base: a hash, or "" for a file removed.
	over map[string]string
	n    int
}

// fileHash is an entry of FileHashes.base.
type fileHash struct {
	name string
	sum  [sha256.Size]byte
}

// FileHashesOf returns the hashes of m, which it does not keep.
func FileHashesOf(m map[string]string) FileHashes {
	f := FileHashes{base: make([]fileHash, 0, len(m)), n: len(m)}
	for name, h := range m {
		f.appendBase(name, h)
	}
	f.sortBase()
	return f
}

// appendBase appends name with hash h to f.base, unsorted.
func (f *FileHashes) appendBase(name, h string) {
	e := fileHash{name: name}
	if !decodeSum(&e.sum, h) {
		if f.text == nil {
			f.text = map[string]string{}
		}
		f.text[name] = h
	}
	f.base = append(f.base, e)
}

func (f *FileHashes) sortBase() {
	slices.SortFunc(f.base, func(a, b fileHash) int { return strings.Compare(a.name, b.name) })
}

// decodeSum reads h into sum when h is a SHA-256 in lower-case hex, the one spelling that
// hex.EncodeToString gives back as it was.
func decodeSum(sum *[sha256.Size]byte, h string) bool {
	if len(h) != 2*sha256.Size {
		return false
	}
	for i := range len(h) {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	_, err := hex.Decode(sum[:], []byte(h))
	return err == nil
}

// find returns the index of name in f.base.
func (f FileHashes) find(name string) (int, bool) {
	return slices.BinarySearchFunc(f.base, name, func(e fileHash, name string) int { return strings.Compare(e.name, name) })
}

// hashOf returns the hash of f.base[i] as it was given.
func (f FileHashes) hashOf(i int) string {
	if h, ok := f.text[f.base[i].name]; ok {
		return h
	}
	return hex.EncodeToString(f.base[i].sum[:])
}

// Get returns the hash of file name.
func (f FileHashes) Get(name string) (string, bool) {
	if h, ok := f.over[name]; ok {
		return h, h != ""
	}
	if i, ok := f.find(name); ok {
		return f.hashOf(i), true
	}
	return "", false
}

// has reports whether f holds file name, without spelling its hash.
func (f FileHashes) has(name string) bool {
	if h, ok := f.over[name]; ok {
		return h != ""
	}
	_, ok := f.find(name)
	return ok
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
		for i := range f.base {
			if _, changed := f.over[f.base[i].name]; !changed && !yield(f.base[i].name, f.hashOf(i)) {
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
	out := FileHashes{base: f.base, text: f.text, over: make(map[string]string, len(f.over)+len(changes)), n: f.n}
	maps.Copy(out.over, f.over)
	for name, h := range changes {
		had := f.has(name)
		switch {
		case h == "" && had:
			out.n--
		case h != "" && !had:
			out.n++
		}
		if _, inBase := f.find(name); h == "" && !inBase {
			delete(out.over, name) // nothing to hide
		} else {
			out.over[name] = h
		}
	}
	if k := len(out.over); k > 32 && k*k > 2*len(out.base) {
		return out.fold()
	}
	return out
}

// fold returns f with its overlay folded into a new base: a merge of the sorted base with the
// few changes sorted, not a sort of the whole.
func (f FileHashes) fold() FileHashes {
	changes := FileHashes{base: make([]fileHash, 0, len(f.over))}
	for name, h := range f.over {
		if h != "" {
			changes.appendBase(name, h)
		}
	}
	changes.sortBase()
	out := FileHashes{base: make([]fileHash, 0, f.n), n: f.n}
	keep := func(from FileHashes, e fileHash) {
		out.base = append(out.base, e)
		if h, ok := from.text[e.name]; ok {
			if out.text == nil {
				out.text = map[string]string{}
			}
			out.text[e.name] = h
		}
	}
	i := 0
	for _, e := range f.base {
		for ; i < len(changes.base) && changes.base[i].name < e.name; i++ {
			keep(changes, changes.base[i])
		}
		if _, changed := f.over[e.name]; !changed {
			keep(f, e)
		}
	}
	for ; i < len(changes.base); i++ {
		keep(changes, changes.base[i])
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
	*f = FileHashesOf(m)
	return nil
}
