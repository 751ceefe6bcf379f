package manifests

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// dirMask is what the source watches of its directory: every change of an entry's content,
// name or mode, and the directory itself going away.
const dirMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// dirEvent is one inotify event of the watched directory.
type dirEvent struct {
	name string // the entry's name; "" for the directory itself
	mask uint32
}

// renamedIn reports whether the event is an entry renamed into the directory (or within it):
// its name appears with the whole content it will have, as an editor's or a tool's atomic
// replace (written beside, renamed over) makes it. Content written in place comes as
// IN_CREATE and IN_MODIFY events instead, in as many steps as the writer takes.
func (e dirEvent) renamedIn() bool { return e.name != "" && e.mask&unix.IN_MOVED_TO != 0 }

func (e dirEvent) String() string {
	return fmt.Sprintf("%q mask=%#x", e.name, e.mask)
}

// errOverflow is what the watcher reports when the kernel dropped events: its queue was full.
var errOverflow = errors.New("inotify queue overflow: events were lost")

// dirWatcher reads the inotify events of one directory, which fsnotify would hand out without
// telling a rename into the directory (complete content) from a file created in place (content
// still to come); the source reads the one at once and waits for the other to settle. Each
// read of the inotify descriptor is delivered as one batch: the events queued at that moment.
type dirWatcher struct {
	file   *os.File
	events chan []dirEvent
	errors chan error
	done   chan struct{}

	mu sync.Mutex
	wd int // the watch descriptor of the directory, -1 when none
}

func newDirWatcher() (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &dirWatcher{file: os.NewFile(uintptr(fd), "inotify"), events: make(chan []dirEvent),
		errors: make(chan error), done: make(chan struct{}), wd: -1}
	go w.read()
	return w, nil
}

// add watches dir (replacing any watch of an earlier add).
func (w *dirWatcher) add(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	wd, err := unix.InotifyAddWatch(int(w.file.Fd()), dir, dirMask)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.wd = wd
	return nil
}

// remove stops watching the directory; a watch the kernel already dropped (the directory was
// deleted) is no error.
func (w *dirWatcher) remove() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wd >= 0 {
		_, _ = unix.InotifyRmWatch(int(w.file.Fd()), uint32(w.wd))
		w.wd = -1
	}
}

// close stops the watcher; its reader returns, and events and errors are closed.
func (w *dirWatcher) close() error {
	close(w.done)
	return w.file.Close()
}

// read delivers the events until the watcher is closed.
func (w *dirWatcher) read() {
	defer close(w.events)
	defer close(w.errors)
	// Enough for hundreds of events with names; the kernel queues the rest for the next read.
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if !w.send(nil, fmt.Errorf("reading inotify events: %w", err)) {
				return
			}
			continue
		}
		evs, overflow := parseEvents(buf[:n], w.watched())
		if overflow && !w.send(nil, errOverflow) {
			return
		}
		if len(evs) > 0 && !w.send(evs, nil) {
			return
		}
	}
}

func (w *dirWatcher) watched() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wd
}

// send delivers a batch or an error, unless the watcher is closed first.
func (w *dirWatcher) send(evs []dirEvent, err error) bool {
	if err != nil {
		select {
		case w.errors <- err:
			return true
		case <-w.done:
			return false
		}
	}
	select {
	case w.events <- evs:
		return true
	case <-w.done:
		return false
	}
}

// parseEvents decodes the struct inotify_event records of one read, keeping those of watch wd
// (an earlier watch's late events say nothing of the directory watched now); overflow reports
// an IN_Q_OVERFLOW among them.
func parseEvents(b []byte, wd int) (evs []dirEvent, overflow bool) {
	for len(b) >= unix.SizeofInotifyEvent {
		ewd := int32(binary.NativeEndian.Uint32(b[0:]))
		mask := binary.NativeEndian.Uint32(b[4:])
		nameLen := int(binary.NativeEndian.Uint32(b[12:]))
		end := unix.SizeofInotifyEvent + nameLen
		if end > len(b) {
			break
		}
		name := b[unix.SizeofInotifyEvent:end]
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		b = b[end:]
		switch {
		case mask&unix.IN_Q_OVERFLOW != 0:
			overflow = true
		case int(ewd) != wd || mask&unix.IN_IGNORED != 0:
			// IN_IGNORED follows the directory's own deletion, reported already, or our
			// remove.
		default:
			evs = append(evs, dirEvent{name: string(name), mask: mask})
		}
	}
	return evs, overflow
}
