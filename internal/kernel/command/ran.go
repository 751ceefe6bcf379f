package command

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/netwarden/netwarden/internal/kernel/kernelwatch"
)

// ranWindow is how long a finished tool is remembered: the kernel's notifications of its
// commits are read a little after it exits.
const ranWindow = 2 * time.Second

// untrackedWindow is how long after it ends a tool run by another library (see Tracked) still
// claims the commits of its name when the generations around it could not be read.
const untrackedWindow = 100 * time.Millisecond

type child struct {
	comm string    // its command name as the kernel reports it (15 bytes at most)
	done time.Time // zero while it runs
	// gens, for a Tracked run, are the nf_tables generations before and after it: its
	// commits made the generations in (gens[0], gens[1]]. Unknown when !hasGens.
	gens    [2]uint32
	hasGens bool
}

var children struct {
	sync.Mutex
	byPID map[int]child
	// untracked are the runs of Tracked, by a key of their own: their PIDs are unknown.
	untracked map[int]child
	next      int
}

// Tracked runs fn, which runs the tool name through a library that starts the process itself
// (knftables runs nft), so that Ran claims that tool's commits made meanwhile: the PID is
// unknown, but the nf_tables generations before and after fn bound the commits it made (a
// commit's notification is queued before the tool exits). Where they cannot be read, the
// tool's name claims commits while fn runs and for 100 ms after.
func Tracked(name string, fn func() error) error {
	g0, err0 := kernelwatch.Generation()
	children.Lock()
	if children.untracked == nil {
		children.untracked = map[int]child{}
	}
	children.next++
	key := children.next
	children.untracked[key] = child{comm: commOf(name)}
	children.Unlock()
	err := fn()
	g1, err1 := kernelwatch.Generation()
	children.Lock()
	children.untracked[key] = child{comm: commOf(name), done: time.Now(), gens: [2]uint32{g0, g1}, hasGens: err0 == nil && err1 == nil}
	for k, c := range children.untracked {
		if !c.done.IsZero() && time.Since(c.done) > ranWindow {
			delete(children.untracked, k)
		}
	}
	children.Unlock()
	return err
}

func commOf(name string) string {
	comm := filepath.Base(name)
	if len(comm) > 15 {
		comm = comm[:15]
	}
	return comm
}

func started(pid int, name string) {
	comm := commOf(name)
	children.Lock()
	defer children.Unlock()
	if children.byPID == nil {
		children.byPID = map[int]child{}
	}
	now := time.Now()
	for p, c := range children.byPID {
		if !c.done.IsZero() && now.Sub(c.done) > ranWindow {
			delete(children.byPID, p)
		}
	}
	children.byPID[pid] = child{comm: comm}
}

func finished(pid int) {
	children.Lock()
	defer children.Unlock()
	if c, ok := children.byPID[pid]; ok {
		c.done = time.Now()
		children.byPID[pid] = c
	}
}

// Ran reports whether the process the kernel reports as pid and comm, committing generation
// (an nf_tables notification's), is a tool Run ran (running or finished within the last 2 s),
// or a commit of a Tracked run. The kernel
// reports PIDs of the initial PID namespace: where this process sees another namespace (a
// container without the host's PIDs), a PID it cannot see is matched by the tool's name.
func Ran(pid int, comm string, generation uint32) bool {
	children.Lock()
	defer children.Unlock()
	now := time.Now()
	if c, ok := children.byPID[pid]; ok && c.comm == comm && (c.done.IsZero() || now.Sub(c.done) <= ranWindow) {
		return true
	}
	for _, c := range children.untracked {
		switch {
		case c.comm != comm:
		case c.hasGens && generation-c.gens[0]-1 < c.gens[1]-c.gens[0]: // in (gens[0], gens[1]], modulo 2^32
			return true
		case !c.hasGens && (c.done.IsZero() || now.Sub(c.done) <= untrackedWindow):
			return true
		case c.done.IsZero():
			return true // still running: its generations are not known yet
		}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil || !foreignPIDNamespace() {
		return false
	}
	for _, c := range children.byPID {
		if c.comm == comm && (c.done.IsZero() || now.Sub(c.done) <= ranWindow) {
			return true
		}
	}
	return false
}

// foreignPIDNamespace reports whether this process is in a PID namespace other than the
// initial one, whose PIDs the kernel's notifications carry.
var foreignPIDNamespace = sync.OnceValue(func() bool {
	// The initial namespace's init is PID 1 there and its inode is fixed (PROC_PID_INIT_INO).
	link, err := os.Readlink("/proc/self/ns/pid")
	return err != nil || link != "pid:[4026531836]"
})
