package cni

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// LockDir holds the lock files; NETWARDEN_CNI_LOCK_DIR overrides it.
const LockDir = "/run/netwarden"

// Lock takes an exclusive flock for one plugin, so that concurrent invocations on a node apply
// their read-modify-write transactions one at a time. The lock goes away with the process.
func Lock(plugin string) (unlock func(), err error) {
	dir := lockDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	path := filepath.Join(dir, plugin+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func lockDir() string {
	if dir := os.Getenv("NETWARDEN_CNI_LOCK_DIR"); dir != "" {
		return dir
	}
	return LockDir
}
