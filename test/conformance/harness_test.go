package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/kubeproxy"
	"github.com/netwarden/netwarden/internal/testkit/minicluster"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
)

// requireCluster skips (fails under CI) unless a minicluster can run here.
func requireCluster(t *testing.T) {
	t.Helper()
	kerneltest.RequireAgent(t, simnode.AgentBinary)
}

// full reports whether the suites run in full (make conformance: NETWARDEN_CONFORMANCE=full)
// rather than the part make test runs.
func full() bool { return os.Getenv("NETWARDEN_CONFORMANCE") == "full" }

// backends are the netwarden backends a suite runs on: NETWARDEN_CONFORMANCE_BACKENDS
// (comma-separated, nftables and iptables); by default both in full, nftables otherwise.
func backends() []string {
	def := "nftables"
	if full() {
		def = "nftables,iptables"
	}
	return strings.Split(envOr("NETWARDEN_CONFORMANCE_BACKENDS", def), ",")
}

// startCluster starts a two-node cluster whose netwarden runs the backend, with kube-proxy in
// the mode of the same kernel interface.
func startCluster(t *testing.T, backend string) *minicluster.Cluster {
	t.Helper()
	agent, _ := simnode.AgentBinary()
	cni := upstreamCNI(t)
	return minicluster.Start(t, minicluster.Options{
		Nodes: 2, Backend: backend, ProxyMode: modeOf(backend), AgentBin: agent,
		CNIBinDirs: []string{cni, filepath.Dir(agent)},
	})
}

// modeOf is the kube-proxy mode of the kernel interface the backend programs.
func modeOf(backend string) kubeproxy.Mode {
	if backend == "iptables" {
		return kubeproxy.IPTables
	}
	return kubeproxy.NFTables
}

var (
	cniOnce sync.Once
	cniDir  string
	cniErr  error
)

// upstreamCNI builds the upstream bridge and host-local plugins (the version go.mod pins) once
// per test binary.
func upstreamCNI(t *testing.T) string {
	t.Helper()
	cniOnce.Do(func() {
		if cniDir, cniErr = os.MkdirTemp("", "netwarden-cni-upstream-"); cniErr != nil {
			return
		}
		cniErr = minicluster.BuildUpstreamCNI(cniDir)
	})
	if cniErr != nil {
		t.Fatal(cniErr)
	}
	return cniDir
}

// kernelHasSCTP reports whether this kernel can open SCTP sockets.
func kernelHasSCTP() bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// summary holds one row per suite run, printed as a table when the package's tests end.
var summary struct {
	sync.Mutex
	rows []string
}

func addSummary(suite, backend string, passed, failed, skipped int, took time.Duration) {
	summary.Lock()
	defer summary.Unlock()
	summary.rows = append(summary.rows, fmt.Sprintf("%-44s %-9s %6d %6d %7d %9v", suite, backend, passed, failed, skipped, took.Round(time.Second)))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if len(summary.rows) > 0 {
		fmt.Printf("\n%-44s %-9s %6s %6s %7s %9s\n", "suite", "backend", "passed", "failed", "skipped", "took")
		for _, r := range summary.rows {
			fmt.Println(r)
		}
	}
	if cniDir != "" {
		os.RemoveAll(cniDir)
	}
	os.Exit(code)
}
