package conformance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// npapiSCTPBlocker says why the network-policy-api suite cannot run on a kernel without SCTP:
// not only its SCTP tests but its setup needs SCTP sockets.
const npapiSCTPBlocker = "this kernel has no SCTP sockets (CONFIG_IP_SCTP unset): every pod of the suite's base " +
	"StatefulSets runs `agnhost porter` serving SCTP on 9003 and 9005, which exits when it cannot listen, so no pod " +
	"becomes Ready and the suite's setup fails before its first test; besides, 12 of its 30 tests probe SCTP"

// TestNetworkPolicyAPIConformance runs the network-policy-api v0.3.0 conformance suite,
// unmodified (hack/conformance.sh compiles the upstream test package), for the
// ClusterNetworkPolicy profile against a minicluster on each backend: with every feature (the
// experimental NamedPorts and EgressNodePeers too) under make conformance, which writes the
// report to conformance/; the standard features otherwise. NETWARDEN_NPAPI_RUN=1 runs it even
// where the kernel lacks SCTP, to see the failure.
func TestNetworkPolicyAPIConformance(t *testing.T) {
	requireCluster(t)
	if !kernelHasSCTP() && os.Getenv("NETWARDEN_NPAPI_RUN") == "" {
		t.Skip("skipping the network-policy-api conformance suite: " + npapiSCTPBlocker)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			c := startCluster(t, backend)
			report := filepath.Join(t.TempDir(), "report.yaml")
			if full() {
				report = filepath.Join(root, "conformance", "reports", "v0.3.0", "netwarden-"+backend+".yaml")
			}
			args := []string{"-all-features"}
			if !full() {
				args = []string{"-all-features=false", "-supported-features=ClusterNetworkPolicy"}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			began := time.Now()
			cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "conformance.sh"), args...)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "NPAPI_REPORT="+report)
			out, runErr := cmd.CombinedOutput()
			took := time.Since(began)
			logPath := filepath.Join(os.TempDir(), "netwarden-npapi-"+backend+".log")
			os.WriteFile(logPath, out, 0o644)
			passed, failed, skipped := goTestResults(string(out), "TestConformanceProfiles/")
			addSummary("network-policy-api v0.3.0 conformance", backend, len(passed), len(failed), len(skipped), took)
			t.Logf("network-policy-api conformance on %s: %d passed, %d failed, %d skipped in %v; log %s",
				backend, len(passed), len(failed), len(skipped), took.Round(time.Second), logPath)
			for _, f := range failed {
				t.Errorf("FAILED: %s", f)
			}
			if runErr != nil {
				t.Errorf("hack/conformance.sh: %v; log %s:\n%s", runErr, logPath, tail(string(out), 8000))
			}
			if len(skipped) > 0 {
				t.Errorf("skipped, where every test must run: %v", skipped)
			}
		})
	}
}

var goTestResult = regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL|SKIP): (\S+)`)

// goTestResults lists the subtests under prefix that `go test -v` output reports passed, failed
// and skipped.
func goTestResults(out, prefix string) (passed, failed, skipped []string) {
	for _, m := range goTestResult.FindAllStringSubmatch(out, -1) {
		name, ok := strings.CutPrefix(m[2], prefix)
		if !ok || strings.Contains(name, "/") {
			continue
		}
		switch m[1] {
		case "PASS":
			passed = append(passed, name)
		case "FAIL":
			failed = append(failed, name)
		case "SKIP":
			skipped = append(skipped, name)
		}
	}
	return passed, failed, skipped
}
