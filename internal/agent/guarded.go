package agent

import (
	"context"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/guard"
	"github.com/netwarden/netwarden/internal/policy"
)

// guarded is the agent's state for what it enforces beside the backend's rules, which
// Config.Guard programs: the deny bit of established flows (Config.DenyMark; 0 keeps them, see
// established.go) and, with the gate (Config.GateSocket, see gate.go), the drop of traffic of
// local pod addresses without verdicts.
type guarded struct {
	flows *flowJudge
	gate  *gateState
}

// compileState is the state the compiler gets: the source's, with the gate's pods.
func (a *Agent) compileState(st *cluster.State) *cluster.State {
	if a.gate == nil {
		return st
	}
	return a.gate.overlay(st, a.cfg.NodeName)
}

// unchangedSync is afterSync for a state that changed nothing in the kernel.
func (a *Agent) unchangedSync() {
	if a.gate != nil {
		a.gate.installed(false, nil, nil)
	}
}

// afterSync runs once the backend holds rs, compiled from st: the guard learns which local
// pods have verdicts now, and the gate answers the pods that waited for theirs. A failure fails
// the sync, so it is retried whole.
func (a *Agent) afterSync(ctx context.Context, st *cluster.State, rs *policy.Ruleset) error {
	if a.np.Guard == nil {
		return nil
	}
	d := guard.Desired{DenyMark: a.np.DenyMark}
	if a.gate != nil {
		d.PodCIDRs, d.Known = a.gate.guardInputs(st, a.cfg.NodeName, a.log)
	}
	if err := a.np.Guard.Sync(ctx, d); err != nil {
		return err
	}
	if a.gate != nil {
		a.gate.installed(true, d.Known, rs)
	}
	return nil
}

// narrowed reports whether some verdict may have gone from allow to deny in a sync from prev
// to rs with result res, for the flow judge, which re-judges established flows after the loop
// moves on (a new pod has no flows to judge, and its start should not wait for a conntrack
// walk). It is asked after the status says the kernel holds rs: nothing there waits for it.
func (a *Agent) narrowed(prev, rs *policy.Ruleset, res dataplane.SyncResult) bool {
	if a.np.Guard == nil {
		return false
	}
	if res.Operations == 0 && !res.Full {
		return false // the rules did not change, nor did any verdict
	}
	return res.Full || rs.Narrows(prev)
}
