package manifests

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// manifestFile reports whether name is a file to read, and whether it is JSON.
func manifestFile(name string) (ok, isJSON bool) {
	if strings.HasPrefix(name, ".") {
		return false, false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		return true, false
	case ".json":
		return true, true
	}
	return false, false
}

// readResult is one file read by readFile.
type readResult struct {
	name   string
	gone   bool // absent, or not a regular file
	fc     *fileContent
	err    error
	stat   statKey
	readAt time.Time
}

// readFile reads and parses one file; prev is its previous parse, reused when the content is
// the same.
func (l *loader) readFile(name string, prev *fileContent) readResult {
	r := readResult{name: name, readAt: time.Now()}
	path := filepath.Join(l.dir, name)
	data, st, err := readRegular(path)
	if err != nil {
		if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
			r.gone = true
			return r
		}
		r.err = &Error{File: path, Item: -1, Err: err}
		return r
	}
	if data == nil {
		l.logger.Debug("ignoring manifest path that is not a regular file", "path", path, "mode", fmt.Sprintf("%#o", st.Mode))
		r.gone = true
		return r
	}
	r.stat = statKeyOf(&st)
	_, isJSON := manifestFile(name)
	if sum := sha256.Sum256(data); prev != nil && prev.sum == sum {
		r.fc = prev
	} else {
		r.fc = parseFile(path, data, sum, isJSON, l.interner, l.logger)
	}
	return r
}

// readRegular reads the file at path (following symlinks) with the stat of what it read; data is
// nil when that is not a regular file. It makes the fewest system calls it can (os.ReadFile
// also stats the path first and registers the descriptor with the poller): at thousands of
// files, a cold start spends a good part of its time in them.
func readRegular(path string) (data []byte, st syscall.Stat_t, err error) {
	var fd int
	for {
		// O_NONBLOCK: opening a FIFO must not wait for a writer; it changes nothing for a
		// regular file.
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, st, err
	}
	defer syscall.Close(fd)
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, st, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, st, nil
	}
	// One byte more than the size, so that a file that has not grown is read in one call: a
	// read that returns less than asked once the size is read is at the end of the file (no
	// second read to find it; a short read before that, on a file system that makes them, is
	// followed by more reads).
	data = make([]byte, 0, st.Size+1)
	for {
		if len(data) == cap(data) {
			data = slices.Grow(data, 4096)
		}
		want := cap(data) - len(data)
		n, err := syscall.Read(fd, data[len(data):cap(data)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, st, err
		}
		data = data[:len(data)+n]
		if n == 0 || n < want && int64(len(data)) >= st.Size {
			return data, st, nil
		}
	}
}

// parallelReads is the number of files from which reading is spread over the CPUs.
const parallelReads = 64

// readFiles reads the named files, in parallel when there are many: parsing YAML is most of the
// cost of a cold start.
func (l *loader) readFiles(names []string) []readResult {
	out := make([]readResult, len(names))
	prev := make([]*fileContent, len(names))
	for i, name := range names {
		if fs := l.files[name]; fs != nil {
			prev[i] = fs.fc
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(names)/parallelReads+1)
	if workers <= 1 {
		for i, name := range names {
			out[i] = l.readFile(name, prev[i])
		}
		return out
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				out[i] = l.readFile(names[i], prev[i])
			}
		}()
	}
	wg.Wait()
	return out
}
