package demo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/simnode"
)

// TestDemo runs `make demo`'s job on the shipped examples and checks what it shows a person:
// the policies close what they should, and masquerade hides pods only outside the cluster.
func TestDemo(t *testing.T) {
	simnode.RequireKernel(t)
	bin, err := simnode.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(&out, bin, "../../examples"); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	report := out.String()
	before, after, ok := strings.Cut(report, "After the policies")
	if !ok {
		t.Fatalf("no matrix after the policies:\n%s", report)
	}
	if strings.Contains(before[strings.Index(before, "Before any NetworkPolicy"):], "--") {
		t.Errorf("something is blocked before any policy:\n%s", before)
	}
	if !strings.Contains(after, "--") || !strings.Contains(after, "ok") {
		t.Errorf("the policies neither block nor allow:\n%s", after)
	}
	for _, want := range []string{
		"frontend/web             192.0.2.1, 2001:db8:ffff::1        10.244.0.4, fd00:10:244::4",
		"inet netwarden-masq: 3 rules",
		"Cleaned up.",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}
