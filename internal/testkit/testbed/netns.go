package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named network namespaces live (the same directory
// `ip netns` uses, so `ip netns exec NAME ...` and `nft` work on them).
const NetNSDir = "/var/run/netns"

// createNamedNetNS creates a new network namespace bind-mounted at
// NetNSDir/name and returns an open handle to it. The calling thread's
// namespace is never changed: the unshare happens on a throw-away OS thread
// which is destroyed afterwards (the goroutine exits while still locked).
func createNamedNetNS(name string) (netns.NsHandle, error) {
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return netns.None(), err
	}
	p := filepath.Join(NetNSDir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return netns.None(), fmt.Errorf("create netns file %s: %w", p, err)
	}
	f.Close()

	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread is tainted (new netns) and must die
		// together with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{netns.None(), fmt.Errorf("unshare(CLONE_NEWNET): %w", err)}
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
			ch <- result{netns.None(), fmt.Errorf("bind mount %s: %w", p, err)}
			return
		}
		h, err := netns.GetFromPath(p)
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		_ = unix.Unmount(p, unix.MNT_DETACH)
		_ = os.Remove(p)
		return netns.None(), r.err
	}
	return r.h, nil
}

// deleteNamedNetNS unmounts and removes NetNSDir/name. Missing files are not
// an error.
func deleteNamedNetNS(name string) error { return RemoveNetNSMount(filepath.Join(NetNSDir, name)) }

// RemoveNetNSMount detaches the netns bind mount at p and removes the file.
// The unmount is lazy: a synchronous one fails with EBUSY while a short-lived
// process that entered the namespace (ip netns exec, a CNI plugin) still holds
// a copy of the mount, and a lazy one lets the namespace go once that process
// exits. Missing files are not an error.
func RemoveNetNSMount(p string) error {
	// The file may carry the namespace more than once (a mount made while another test's
	// process copied the mount table can come back through shared propagation stacked on the
	// first), or get one again a moment after: each unmount takes one off, and a remove that
	// finds the file busy starts over.
	for attempt := 1; ; attempt++ {
		for {
			err := unix.Unmount(p, unix.MNT_DETACH)
			if err == nil {
				continue
			}
			if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
			break
		}
		err := os.Remove(p)
		switch {
		case err == nil || errors.Is(err, os.ErrNotExist):
			return nil
		case !errors.Is(err, unix.EBUSY) || attempt == 5:
			return fmt.Errorf("remove %s: %w", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inNetNS runs fn on the calling goroutine with its OS thread switched into
// target. The original namespace is restored afterwards; if restoring fails
// the thread stays locked (so the Go runtime never reuses it) and an error
// is returned.
func inNetNS(target netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns: %w", err)
	}
	var fnErr error
	func() {
		defer func() {
			if r := recover(); r != nil {
				restoreOrDie(orig)
				panic(r)
			}
		}()
		fnErr = fn()
	}()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: it is destroyed when this goroutine exits.
		return errors.Join(fnErr, fmt.Errorf("restore netns (thread left locked): %w", err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

func restoreOrDie(orig netns.NsHandle) {
	if err := netns.Set(orig); err == nil {
		runtime.UnlockOSThread()
	}
}

// inNetNSGo is like inNetNS but runs fn on a fresh goroutine, so a failure to
// restore the namespace can never leak into the caller's goroutine.
func inNetNSGo(target netns.NsHandle, fn func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- inNetNS(target, fn) }()
	return <-ch
}

type sysctl struct{ key, val string }

// setSysctls writes the given sysctls (dotted keys, e.g. "net.ipv4.ip_forward")
// inside the target namespace. /proc/sys/net resolves against the network
// namespace of the thread doing the lookup.
func setSysctls(target netns.NsHandle, kvs []sysctl) error {
	return inNetNSGo(target, func() error {
		for _, kv := range kvs {
			p := "/proc/sys/" + strings.ReplaceAll(kv.key, ".", "/")
			if err := os.WriteFile(p, []byte(kv.val), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s: %w", kv.key, kv.val, err)
			}
		}
		return nil
	})
}

// CreateNetNS creates the network namespace NetNSDir/name, for kits that wire namespaces of
// their own (a minicluster's underlay and nodes); the caller closes the handle and removes the
// namespace with RemoveNetNSMount.
func CreateNetNS(name string) (netns.NsHandle, error) { return createNamedNetNS(name) }

// InNetNSGo runs fn on a fresh goroutine whose OS thread is switched into target, and waits
// for it.
func InNetNSGo(target netns.NsHandle, fn func() error) error { return inNetNSGo(target, fn) }
