package agent

import (
	"context"
	"os"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"time"
)

// quietBeforeRelease is how long no change must come before the agent gives the pages a burst
// of changes left behind back to the kernel.
const quietBeforeRelease = 2 * time.Second

// releaseSlack is how much memory the heap may hold beyond its live objects before a quiet
// period is worth a release (a forced collection, tens of milliseconds of CPU at scale).
const releaseSlack = 16 << 20

// releaseWhenQuiet returns the heap's garbage and free pages to the kernel once the agent has
// been quiet for quietBeforeRelease after changes. Between collections Go lets the heap grow
// to twice what is live, and keeps what it freed for reuse: at 16,000 objects a node agent
// that handled a few changes would otherwise stay half again larger than it needs while it
// sits idle, which is most of its life.
func (a *Agent) releaseWhenQuiet(ctx context.Context) {
	samples := []runtimemetrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
	}
	quiet := time.NewTimer(quietBeforeRelease)
	quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.changed:
			quiet.Reset(quietBeforeRelease)
		case <-quiet.C:
			runtimemetrics.Read(samples)
			live := samples[0].Value.Uint64()
			held := samples[1].Value.Uint64() + samples[2].Value.Uint64() + samples[3].Value.Uint64()
			if held > live+releaseSlack {
				debug.FreeOSMemory()
			}
		}
	}
}

// steadyGCPercent is how far the heap may grow beyond its live objects before a collection, once
// the first sync is done. Go's default (100) suits the load, which makes most of the garbage the
// agent ever makes and should not stop to collect it often. After it, the live heap is the
// cluster's objects (tens of megabytes at thousands of them) and a change makes well under a
// megabyte of garbage: at 100 the heap would idle at twice the live size, at 25 a collection
// comes every dozen changes or so, a few milliseconds of one CPU each.
const steadyGCPercent = 25

// settleGC sets the collector for the steady state, unless the operator chose for the process
// (GOGC or GOMEMLIMIT in its environment, as a DaemonSet can set from its memory limit).
func settleGC() {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetGCPercent(steadyGCPercent)
}
