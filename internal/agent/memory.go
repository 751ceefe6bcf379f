package agent

import (
	"context"
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
