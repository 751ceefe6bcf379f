// Package kerneltest holds the checks and helpers that kernel tests share: they fail a test
// that cannot run in CI and skip it, saying why, elsewhere. It is the one test kit that
// imports testing, so the shipped binaries, which link testbed and simnode for the demo, do
// not.
package kerneltest

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
	Require(t, commands...)
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

// Require is the check of InFreshNetNS for kernel tests that make network namespaces of
// their own (a testbed.Bed): it fails the test when not root in CI (CI must run every kernel test) and
// skips it, saying why, elsewhere; a missing command is a failure, because make deps installs
// them all.
func Require(t testing.TB, commands ...string) {
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

// RequireAgent skips the test (or fails it when $CI is set: CI must run everything) unless it
// can create network namespaces, program nftables and run the agent binary that agentBinary
// finds (simnode.AgentBinary; passed in, since the agent's own packages have kernel tests).
func RequireAgent(t testing.TB, agentBinary func() (string, error)) {
	t.Helper()
	var why string
	switch {
	case os.Geteuid() != 0:
		why = "needs root for network namespaces and nftables"
	case !hasCmd("ip") || !hasCmd("nft"):
		why = "needs iproute2 and nftables (make deps installs them)"
	}
	if _, err := agentBinary(); err != nil && why == "" {
		why = err.Error()
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("kernel test cannot run in CI: %s", why)
	}
	t.Skipf("skipping kernel test: %s", why)
}

func hasCmd(name string) bool { _, err := exec.LookPath(name); return err == nil }
