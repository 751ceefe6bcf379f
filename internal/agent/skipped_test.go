package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
)

// TestSkipReport: a skipped policy is named in a warning when it starts being skipped or its
// reason changes, not at every sync, and an info line says when it no longer is.
func TestSkipReport(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var r skipReport
	a := policy.SkippedPolicy{Policy: "x/a", Reason: "too big"}
	b := policy.SkippedPolicy{Policy: "y/b", Reason: "bad name"}
	for i, step := range []struct {
		skipped []policy.SkippedPolicy
		want    []string
	}{
		{nil, nil},
		{[]policy.SkippedPolicy{a, b}, []string{`level=WARN msg="policy skipped`, "policy=x/a", `reason="too big"`, "policy=y/b", `reason="bad name"`}},
		{[]policy.SkippedPolicy{a, b}, nil},
		{[]policy.SkippedPolicy{{Policy: "x/a", Reason: "bigger"}}, []string{"policy=x/a reason=bigger", `msg="policy no longer skipped" policy=y/b`}},
		{nil, []string{`msg="policy no longer skipped" policy=x/a`}},
	} {
		buf.Reset()
		r.report(log, "test", step.skipped)
		got := buf.String()
		if step.want == nil && got != "" {
			t.Errorf("step %d logged %q, want nothing", i, got)
		}
		for _, w := range step.want {
			if !strings.Contains(got, w) {
				t.Errorf("step %d: %q lacks %q", i, got, w)
			}
		}
	}
}
