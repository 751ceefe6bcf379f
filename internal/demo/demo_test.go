package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
)

// TestDemo runs `make demo`'s job on the shipped examples: every verdict it probes must be the
// expected one, and the report says so.
func TestDemo(t *testing.T) {
	kerneltest.RequireAgent(t, simnode.AgentBinary)
	bin, err := simnode.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(&out, bin, "../../examples"); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	report := out.String()
	_, after, ok := strings.Cut(report, "After the policies")
	if !ok {
		t.Fatalf("no matrix after the policies:\n%s", report)
	}
	if got := strings.Count(after, "DENIED"); got != 10 {
		t.Errorf("%d DENIED cells after the policies, want 10:\n%s", got, after)
	}
	for _, want := range []string{
		"frontend/web             192.0.2.1, 2001:db8:ffff::1        10.244.0.4, fd00:10:244::4",
		"inet netwarden-masq: 3 rules",
		"masquerade: 12/12 sources as expected; before the policies: 24/24 pairs as expected",
		"verified: 24/24 pairs as expected",
		"Cleaned up.",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, " !") {
		t.Errorf("the report marks a difference:\n%s", report)
	}
}

// TestDemoFailsOnDifference runs the demo with one expected verdict flipped: it must fail,
// naming the pair, and mark the cell.
func TestDemoFailsOnDifference(t *testing.T) {
	kerneltest.RequireAgent(t, simnode.AgentBinary)
	bin, err := simnode.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"manifests/cluster.yaml", "manifests/policies.yaml", "masq-config.yaml", ExpectedVerdictsFile} {
		data, err := os.ReadFile(filepath.Join("../../examples", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == ExpectedVerdictsFile {
			const line = "{from: backend/db, to: backend/api, port: 80, verdict: denied}"
			if !bytes.Contains(data, []byte(line)) {
				t.Fatalf("%s lacks %s", f, line)
			}
			data = bytes.Replace(data, []byte(line), []byte(strings.Replace(line, "denied", "allowed", 1)), 1)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err = Run(&out, bin, dir)
	if err == nil {
		t.Fatalf("the demo passed with a wrong expectation:\n%s", out.String())
	}
	if !strings.Contains(err.Error(), "backend/db -> backend/api TCP/80: probed denied (0 of 2 families connected), want ok") {
		t.Errorf("the error does not name the pair: %v", err)
	}
	if !strings.Contains(out.String(), "DENIED !") || !strings.Contains(out.String(), "verified: 23/24 pairs as expected") {
		t.Errorf("the report does not mark the difference:\n%s", out.String())
	}
}

func TestLoadExpectedErrors(t *testing.T) {
	pods := []string{"a/x", "a/y"}
	ports := []uint16{80}
	for _, tc := range []struct{ name, content, want string }{
		{"complete", "- {from: a/x, to: a/y, port: 80, verdict: allowed}\n- {from: a/y, to: a/x, port: 80, verdict: denied}\n", ""},
		{"missing pair", "- {from: a/x, to: a/y, port: 80, verdict: allowed}\n", "no verdict for a/y -> a/x port 80"},
		{"bad verdict", "- {from: a/x, to: a/y, port: 80, verdict: maybe}\n", `item 0 (a/x -> a/y port 80): verdict: "maybe" is neither`},
		{"unknown pod", "- {from: a/z, to: a/y, port: 80, verdict: allowed}\n", `from: no pod "a/z"`},
		{"unknown field", "- {from: a/x, to: a/y, port: 80, verdit: allowed}\n", `unknown field "verdit"`},
		{"duplicate", "- {from: a/x, to: a/y, port: 80, verdict: allowed}\n- {from: a/x, to: a/y, port: 80, verdict: allowed}\n", "item 1 (a/x -> a/y port 80): a second verdict"},
		{"port not probed", "- {from: a/x, to: a/y, port: 81, verdict: allowed}\n", "port: the demo probes ports [80] only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), ExpectedVerdictsFile)
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := LoadExpected(path, pods, ports)
			if tc.want == "" {
				if err != nil || !got[VerdictKey{"a/x", "a/y", 80}] || got[VerdictKey{"a/y", "a/x", 80}] {
					t.Fatalf("got %v, %v", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %v; want one naming %s and containing %q", err, path, tc.want)
			}
		})
	}
}
