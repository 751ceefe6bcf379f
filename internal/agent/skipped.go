package agent

import (
	"log/slog"
	"slices"

	"github.com/netwarden/netwarden/internal/policy"
)

// skipReport remembers which policies the backend skipped at the last sync, so that each is
// logged when it starts being skipped (or its reason changes), not at every sync.
type skipReport struct{ last []policy.SkippedPolicy }

// report logs a warning for each skipped policy that is new since the last sync, and an info
// line for each that no longer is (it was changed to one the backend can express, or deleted).
func (r *skipReport) report(log *slog.Logger, backend string, skipped []policy.SkippedPolicy) {
	if slices.Equal(r.last, skipped) {
		return
	}
	for _, s := range skipped {
		if !slices.Contains(r.last, s) {
			log.Warn("policy skipped: the backend cannot express it; its pods stay isolated and it admits nothing",
				"policy", s.Policy, "reason", s.Reason, "backend", backend)
		}
	}
	for _, s := range r.last {
		if !slices.ContainsFunc(skipped, func(n policy.SkippedPolicy) bool { return n.Policy == s.Policy }) {
			log.Info("policy no longer skipped", "policy", s.Policy, "backend", backend)
		}
	}
	r.last = slices.Clone(skipped)
}
