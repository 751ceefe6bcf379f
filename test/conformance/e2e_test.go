package conformance

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/kubetest"
)

// e2eFocusAll is every test of the Kubernetes e2e NetworkPolicy suite (test/e2e/network/netpol).
const e2eFocusAll = `\[Feature:NetworkPolicy\]`

// e2eFocusQuick is the part make test runs (a minute or two): default deny over TCP and UDP,
// pod and namespace selectors on ingress and egress, a named port, and a policy update.
const e2eFocusQuick = `NetworkPolicy between server and client (using UDP )?should (` +
	`support a 'default-deny-ingress' policy|` +
	`enforce policy based on PodSelector with MatchExpressions|` +
	`allow ingress access from namespace on one named port|` +
	`enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector|` +
	`enforce updated policy)`

// e2eSkipSCTP names the tests that open SCTP sockets in pods: this kernel has none
// (CONFIG_IP_SCTP unset), so their servers cannot listen. Only they are skipped, with the reason
// printed; the tests about SCTP policies that need no SCTP socket still run.
const e2eSkipSCTP = `\[Feature:SCTPConnectivity\]`

// TestKubernetesNetworkPolicyE2E runs the e2e.test binary of k8s.io/kubernetes (built by
// hack/kube-binaries.sh e2e), unmodified, against a minicluster for each backend, and prints a
// summary of its JUnit report. make conformance runs the whole suite on both backends
// (NETWARDEN_CONFORMANCE=full); make test runs e2eFocusQuick on one. NETWARDEN_E2E_FOCUS picks
// other tests.
func TestKubernetesNetworkPolicyE2E(t *testing.T) {
	requireCluster(t)
	e2e := kubetest.Binary(t, "e2e.test")
	focus := e2eFocusQuick
	if full() {
		focus = e2eFocusAll
	}
	focus = envOr("NETWARDEN_E2E_FOCUS", focus)
	skip := e2eSkipSCTP
	if !kernelHasSCTP() {
		t.Logf("skipping the tests matching %s: this kernel has no SCTP sockets (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails), which their servers need", skip)
	} else {
		skip = ""
	}
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			c := startCluster(t, backend)
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), e2eTimeout())
			defer cancel()
			args := []string{
				"--kubeconfig=" + c.Kubeconfig,
				"--provider=skeleton",
				"--ginkgo.focus=" + focus,
				"--ginkgo.junit-report=" + filepath.Join(dir, "junit.xml"),
				"--ginkgo.timeout=" + e2eTimeout().String(),
				"--ginkgo.no-color",
				"--ginkgo.v",
				"--disable-log-dump",
				"--dump-logs-on-failure=false",
				"--allowed-not-ready-nodes=0",
				"--node-os-distro=debian",
				"--num-nodes=" + fmt.Sprint(len(c.Nodes)),
			}
			if skip != "" {
				args = append(args, "--ginkgo.skip="+skip)
			}
			began := time.Now()
			cmd := exec.CommandContext(ctx, e2e, args...)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "HOME="+dir)
			out, runErr := cmd.CombinedOutput()
			took := time.Since(began)
			logPath := filepath.Join(os.TempDir(), "netwarden-e2e-"+backend+".log")
			os.WriteFile(logPath, out, 0o644)
			sum, err := readJUnit(filepath.Join(dir, "junit.xml"), regexp.MustCompile(focus))
			if err != nil {
				t.Fatalf("e2e.test (%v, log %s): no report: %v\n%s", runErr, logPath, err, tail(string(out), 8000))
			}
			t.Logf("Kubernetes e2e NetworkPolicy on %s: %d passed, %d failed, %d skipped (%d not selected) in %v; log: %s",
				backend, sum.passed, len(sum.failed), sum.skipped, sum.notSelected, took.Round(time.Second), logPath)
			addSummary("Kubernetes e2e NetworkPolicy", backend, sum.passed, len(sum.failed), sum.skipped, took)
			for _, f := range sum.failed {
				t.Errorf("FAILED: %s", f)
			}
			if runErr != nil && len(sum.failed) == 0 {
				t.Errorf("e2e.test failed (%v) with no failed test in its report; log %s:\n%s", runErr, logPath, tail(string(out), 8000))
			}
			if sum.passed == 0 {
				t.Errorf("no test passed (focus %q)", focus)
			}
		})
	}
}

type junitSummary struct {
	passed, skipped, notSelected int
	failed                       []string
}

// readJUnit counts the specs of Ginkgo's JUnit report ("[It] ..." cases; the suite's setup
// nodes are cases too). Ginkgo reports every spec the focus did not select as skipped: a
// skipped spec counts as skipped only when the focus selects it (then --ginkgo.skip or the
// spec itself skipped it).
func readJUnit(path string, focus *regexp.Regexp) (junitSummary, error) {
	var doc struct {
		Suites []struct {
			Cases []struct {
				Name    string `xml:"name,attr"`
				Status  string `xml:"status,attr"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
				Failure *struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return junitSummary{}, err
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		return junitSummary{}, fmt.Errorf("%s: %w", path, err)
	}
	var s junitSummary
	for _, suite := range doc.Suites {
		for _, c := range suite.Cases {
			if !strings.HasPrefix(c.Name, "[It] ") {
				if c.Failure != nil {
					s.failed = append(s.failed, c.Name+": "+firstLine(c.Failure.Message))
				}
				continue
			}
			switch {
			case c.Failure != nil || c.Status == "failed" || c.Status == "panicked" || c.Status == "timedout" || c.Status == "interrupted":
				msg := ""
				if c.Failure != nil {
					msg = ": " + firstLine(c.Failure.Message)
				}
				s.failed = append(s.failed, c.Name+msg)
			case (c.Skipped != nil || c.Status == "skipped" || c.Status == "pending") && !focus.MatchString(c.Name):
				s.notSelected++
			case c.Skipped != nil || c.Status == "skipped":
				s.skipped++
			case c.Status == "passed":
				s.passed++
			}
		}
	}
	return s, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

func e2eTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("NETWARDEN_E2E_TIMEOUT")); err == nil {
		return d
	}
	return 2 * time.Hour
}
