package manifests

import (
	"cmp"
	"path/filepath"
	"slices"
)

// resolveDuplicates finds objects defined in more than one file. The file that defined the object
// in the previous state keeps it (or, when none did, the lexically first file); a file with new
// content that loses an object is treated like a broken file: it keeps its last good content.
// files (sorted) are the files being updated and content their content, which is updated in
// place; every other file keeps the objects it owns. The problems are returned by file.
func (l *loader) resolveDuplicates(files []string, updating map[string]bool, content map[string]*fileContent, fresh map[string]bool) map[string][]error {
	type loss struct {
		obj    *object
		winner string
	}
	errs := map[string][]error{}
	for {
		// Sized by the objects of the files being updated, not by every object in effect: a
		// change of one file must not allocate for the whole directory.
		n := 0
		for _, name := range files {
			if fc := content[name]; fc != nil {
				n += len(fc.objects)
			}
		}
		providers := make(map[objKey][]string, n)
		for _, name := range files {
			fc := content[name]
			if fc == nil {
				continue
			}
			for _, o := range fc.objects {
				providers[o.key] = append(providers[o.key], name)
			}
		}
		// objectIn returns the object key of a file's content; looked up only for duplicates,
		// which are rare, rather than indexed for every object.
		objectIn := func(key objKey, name string) *object {
			fc := content[name]
			if !updating[name] {
				fc = l.files[name].good
			}
			for _, o := range fc.objects {
				if o.key == key {
					return o
				}
			}
			return nil
		}
		losses := map[string][]loss{}
		for key, names := range providers {
			// A file not being updated that holds the object holds it still.
			if ow, ok := l.owner[key]; ok && !updating[ow.file] {
				names = append(names, ow.file)
				slices.Sort(names)
			}
			if len(names) < 2 {
				continue
			}
			winner := names[0]
			if prev, ok := l.owner[key]; ok && slices.Contains(names, prev.file) {
				winner = prev.file
			}
			for _, name := range names {
				if name == winner {
					continue
				}
				if !fresh[name] {
					// Cannot happen: content in effect before had no duplicates, and the previous
					// owner of a key always wins. Drop the object rather than the file.
					l.logger.Error("manifests: unexpected duplicate in retained content", "file", name, "object", key.String())
					continue
				}
				losses[name] = append(losses[name], loss{obj: objectIn(key, name), winner: winner})
			}
		}
		if len(losses) == 0 {
			return errs
		}
		// Revert first the files that lose to a file which does not lose anything itself: their
		// fate is certain. Reverting them may resolve the other conflicts.
		var revert []string
		for name, ls := range losses {
			for _, x := range ls {
				if _, alsoLoses := losses[x.winner]; !alsoLoses {
					revert = append(revert, name)
					break
				}
			}
		}
		if len(revert) == 0 {
			for name := range losses {
				revert = append(revert, name)
			}
		}
		slices.Sort(revert)
		// The messages name the winners' objects in the content this round started from, so
		// they are all written before any file is reverted.
		for _, name := range revert {
			ls := losses[name]
			slices.SortFunc(ls, func(a, b loss) int {
				return cmp.Or(cmp.Compare(a.obj.doc, b.obj.doc), cmp.Compare(a.obj.item, b.obj.item))
			})
			for _, x := range ls {
				other := objectIn(x.obj.key, x.winner)
				kept := "this file is not applied"
				if l.files[name].good != nil {
					kept = "keeping this file's previous content"
				}
				winner := filepath.Join(l.dir, x.winner)
				errs[name] = append(errs[name], x.obj.loc(filepath.Join(l.dir, name)).errorf("duplicate %s: also defined in %s (%s); %s",
					x.obj.key, winner, other.loc(winner).docRef(), kept))
			}
		}
		for _, name := range revert {
			fresh[name] = false
			if g := l.files[name].good; g != nil {
				content[name] = g
			} else {
				delete(content, name)
			}
		}
	}
}
