package cni

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// LockDir holds the lock files; NETWARDEN_CNI_LOCK_DIR overrides it.
const LockDir = "/run/netwarden"

// Lock takes an exclusive flock for one plugin, so that concurrent invocations on a node apply
// their read-modify-write transactions one at a time. It gives up when ctx ends (a stuck holder
// must not wedge every later invocation); the lock goes away with the process.
func Lock(ctx context.Context, plugin string) (unlock func(), err error) {
	dir := lockDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	path := filepath.Join(dir, plugin+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	// A blocking flock in a goroutine: the kernel wakes one waiter per release, where polling
	// by dozens of concurrent invocations would burn the CPU they are waiting for.
	done := make(chan error, 1)
	go func() {
		for {
			err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
			if err != unix.EINTR {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		// Should the goroutine still get the lock, it lets go of it at once.
		go func() { <-done; f.Close() }()
		return nil, fmt.Errorf("%w: waiting for %s held by another invocation", ErrLockTimeout, path)
	}
}

// ErrLockTimeout is returned by Lock when its context ends first.
var ErrLockTimeout = errors.New("lock timeout")

func lockDir() string {
	if dir := os.Getenv("NETWARDEN_CNI_LOCK_DIR"); dir != "" {
		return dir
	}
	return LockDir
}
