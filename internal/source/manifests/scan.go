package manifests

import (
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// statKey is what a stat says of a file's content, to find the files changed without reading them.
type statKey struct {
	size, mtime int64
	ino, dev    uint64
	mode        uint32
}

func statKeyOf(st *syscall.Stat_t) statKey {
	return statKey{size: st.Size, mtime: st.Mtim.Nano(), ino: st.Ino, dev: uint64(st.Dev), mode: st.Mode}
}

// stale returns the files that a scan of the directory (see scanDir) shows changed since they
// were read, appeared or went away, without reading any.
func (l *loader) stale(scan map[string]scanEntry) []string {
	var names []string
	for name, e := range scan {
		fs := l.files[name]
		// A file written again within the timestamp granularity of the file system, with the
		// same size, looks unchanged: a file modified close to when it was read is read again.
		if fs == nil || e.err != nil || fs.err != nil || e.stat != fs.stat || e.stat.mtime >= fs.readAt-int64(racyWindow) {
			names = append(names, name)
		}
	}
	for name := range l.files {
		if _, ok := scan[name]; !ok {
			names = append(names, name)
		}
	}
	return names
}

// racyWindow bounds the timestamp granularity of file systems (coarse kernel clocks tick every
// few milliseconds; some file systems keep seconds).
const racyWindow = 2 * time.Second

// scanEntry is what scanDir found of one manifest file.
type scanEntry struct {
	stat statKey
	err  error
}

// scanDir lists the manifest files of dir with what a stat says of them; it reads none and
// touches no loader state, so that it can run beside the event loop.
func scanDir(dir string) (map[string]scanEntry, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string]scanEntry, len(entries))
	for _, e := range entries {
		if ok, _ := manifestFile(e.Name()); !ok {
			continue
		}
		var st syscall.Stat_t
		err := syscall.Stat(filepath.Join(dir, e.Name()), &st)
		switch {
		case err != nil:
			out[e.Name()] = scanEntry{err: err}
		case st.Mode&syscall.S_IFMT == syscall.S_IFREG:
			out[e.Name()] = scanEntry{stat: statKeyOf(&st)}
		}
	}
	return out, nil
}
