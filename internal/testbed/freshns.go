package testbed

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// InFreshNetNS runs fn on the calling goroutine with its thread switched into a new, empty
// network namespace, for kernel tests of a backend alone: the nft, iptables and ipset commands
// that fn runs inherit the thread's namespace, so they never touch the host's. It fails the
// test when not root in CI (CI must run every kernel test) and skips it, saying why, elsewhere;
// a missing command is a failure, because make deps installs them all.
func InFreshNetNS(t testing.TB, fn func(), commands ...string) {
	t.Helper()
	RequireKernel(t, commands...)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	fresh, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic("cannot return to the original network namespace: " + err.Error())
		}
	}()
	fn()
}

// RequireKernel is the check of InFreshNetNS for kernel tests that make network namespaces of
// their own (a Bed): it fails the test when not root in CI (CI must run every kernel test) and
// skips it, saying why, elsewhere; a missing command is a failure, because make deps installs
// them all.
func RequireKernel(t testing.TB, commands ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("kernel test needs root, and CI must run it")
		}
		t.Skip("skipping: kernel test needs root")
	}
	for _, cmd := range commands {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Fatalf("%s not installed (make deps installs it): %v", cmd, err)
		}
	}
}
