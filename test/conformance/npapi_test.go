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
			r := runConformanceScript(t, root, c.Kubeconfig, "netwarden-npapi-"+backend+".log", []string{"NPAPI_REPORT=" + report}, args...)
			out, runErr, took, logPath := r.out, r.err, r.took, r.logPath
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

// runConformanceScript runs hack/conformance.sh against the cluster of kubeconfig (within an
// hour) and keeps its output in logName under the temporary directory, for the failure report.
func runConformanceScript(t *testing.T, root, kubeconfig, logName string, env []string, args ...string) scriptRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "conformance.sh"), args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+kubeconfig), env...)
	r := scriptRun{logPath: filepath.Join(os.TempDir(), logName)}
	r.out, r.err = cmd.CombinedOutput()
	r.took = time.Since(began)
	if err := os.WriteFile(r.logPath, r.out, 0o644); err != nil {
		t.Logf("keeping the output: %v", err)
	}
	return r
}

// scriptRun is what a run of hack/conformance.sh gave.
type scriptRun struct {
	out     []byte
	err     error
	took    time.Duration
	logPath string
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

// TestNetworkPolicyAPIWithoutSCTP is the diagnostic run of the network-policy-api conformance
// tests for a kernel without SCTP (hack/conformance.sh nosctp): the suite's tests, unmodified,
// with its manifests minus the SCTP server containers, so that its pods become Ready. It is not
// conformance and writes no report. A test whose last failing probe is SCTP is counted as
// blocked by the kernel; any other failure is a fault. make conformance runs it where the
// kernel lacks SCTP (NETWARDEN_NPAPI_NOSCTP=1 runs it alone).
func TestNetworkPolicyAPIWithoutSCTP(t *testing.T) {
	requireCluster(t)
	if kernelHasSCTP() {
		t.Skip("this kernel has SCTP: TestNetworkPolicyAPIConformance runs the suite itself")
	}
	if !full() && os.Getenv("NETWARDEN_NPAPI_NOSCTP") == "" {
		t.Skip("skipping the network-policy-api diagnostic run (10 minutes): make conformance runs it")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			c := startCluster(t, backend)
			r := runConformanceScript(t, root, c.Kubeconfig, "netwarden-npapi-nosctp-"+backend+".log", nil, "nosctp")
			out, runErr, took, logPath := r.out, r.err, r.took, r.logPath
			const prefix = "TestConformanceWithoutSCTPServers/"
			passed, failed, _ := goTestResults(string(out), prefix)
			var blocked, faults []string
			for _, name := range failed {
				if proto := lastFailedProbe(string(out), prefix+name); proto == "sctp" {
					blocked = append(blocked, name)
				} else {
					faults = append(faults, name)
				}
			}
			addSummary("network-policy-api v0.3.0 without SCTP (diagnostic)", backend, len(passed), len(faults), len(blocked), took)
			t.Logf("network-policy-api tests without SCTP servers on %s: %d passed, %d failed, %d blocked at an SCTP probe %v, in %v; log %s",
				backend, len(passed), len(faults), len(blocked), blocked, took.Round(time.Second), logPath)
			for _, f := range faults {
				t.Errorf("FAILED: %s (its last failing probe: %q)", f, lastFailedProbe(string(out), prefix+f))
			}
			if runErr != nil && len(failed) == 0 {
				t.Errorf("hack/conformance.sh nosctp: %v; log %s:\n%s", runErr, logPath, tail(string(out), 8000))
			}
			if len(passed) == 0 {
				t.Errorf("no test passed; log %s", logPath)
			}
		})
	}
}

var failedProbe = regexp.MustCompile(`FAILED Command was \[?/agnhost connect .*--protocol=(\w+)`)

// lastFailedProbe is the protocol of the last probe the test logged as failed, "" if none.
func lastFailedProbe(out, test string) string {
	start := strings.Index(out, "=== RUN   "+test+"\n")
	if start < 0 {
		return ""
	}
	// Its output runs until a test that is not one of its subtests starts (go test -v prints
	// the subtests' results at the end of the run).
	section := out[start+len("=== RUN   "):]
	for off := 0; ; {
		next := strings.Index(section[off:], "=== RUN   ")
		if next < 0 {
			break
		}
		name := section[off+next+len("=== RUN   "):]
		if !strings.HasPrefix(name, test+"/") {
			section = section[:off+next]
			break
		}
		off += next + len("=== RUN   ")
	}
	m := failedProbe.FindAllStringSubmatch(section, -1)
	if len(m) == 0 {
		return ""
	}
	return strings.ToLower(m[len(m)-1][1])
}
