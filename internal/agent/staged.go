package agent

import (
	"strings"
	"time"

	"github.com/netwarden/netwarden/internal/kernel/nflog"
	"github.com/netwarden/netwarden/internal/policy"
)

// handleStaged logs a connection the kernel reported as judged otherwise by the staged
// policies; ok is false when the prefix is not a staged verdict's.
func (d *dropLog) handleStaged(p nflog.Packet, now time.Time) bool {
	outcome, causeID, ok := policy.ParseStagedLogID(p.Prefix)
	if !ok {
		return false
	}
	if d.duplicate(p, now) {
		return true
	}
	attrs := d.flowAttrs([]any{"outcome", outcome}, p)
	var cause policy.StagedCause
	found := false
	if rs := d.a.applied.Load(); rs != nil && rs.Staged != nil {
		cause, found = rs.Staged.Causes[causeID]
	}
	if found {
		attrs = append(attrs, "direction", string(cause.Direction), "stagedPolicies", strings.Join(cause.Policies, ","), "rule", cause.Rule)
	} else {
		attrs = append(attrs, "reason", "rule "+p.Prefix+" no longer in the applied rules")
	}
	d.a.log.Info("connection judged otherwise by staged policies", attrs...)
	return true
}

// nflogConfig is the NFLOG group the agent reads, nil when it logs neither drops nor staged
// verdicts, and the flag that asks for it.
func (a *Agent) nflogConfig() (*policy.DropLog, string) {
	switch {
	case a.np == nil:
		return nil, ""
	case a.np.DropLog != nil && a.np.StagedLog != nil:
		return a.np.DropLog, "--log-drops and --log-staged"
	case a.np.DropLog != nil:
		return a.np.DropLog, "--log-drops"
	case a.np.StagedLog != nil:
		if _, ok := a.np.Backend.(policy.StagedReporter); ok {
			return a.np.StagedLog, "--log-staged"
		}
	}
	return nil, ""
}
