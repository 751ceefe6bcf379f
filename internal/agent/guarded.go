package agent

import (
	"context"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/guard"
	"github.com/netwarden/netwarden/internal/nftnl"
	"github.com/netwarden/netwarden/internal/policy"
)

// guarded is the agent's state for what it enforces beside the backend's rules: the deny bit
// of established flows (Config.DenyMark, 0 keeps established flows as they are) and, with the
// gate, the drop of local pods without verdicts. Config.Guard programs both.
type guarded struct {
	ctSock    *nftnl.Raw
	anyMarked bool // the last pass left some entry with the deny bit
}

// afterSync runs once the backend holds rs: the guard learns the rules' new state, then the
// established flows are re-judged. A failure fails the sync, so it is retried whole.
func (a *Agent) afterSync(ctx context.Context, rs *policy.Ruleset, res dataplane.SyncResult) error {
	if a.cfg.Guard == nil {
		return nil
	}
	if err := a.cfg.Guard.Sync(ctx, guard.Desired{DenyMark: a.cfg.DenyMark}); err != nil {
		return err
	}
	if res.Operations == 0 && !res.Full {
		return nil // the rules did not change, nor did any verdict
	}
	return a.establishedPass(rs)
}
