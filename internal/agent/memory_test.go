package agent

import (
	"context"
	"runtime"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"testing"
	"time"
)

var sink [][]byte

// TestReleaseWhenQuiet: after a change and a quiet period, the garbage a burst left behind is
// given back to the kernel; while changes keep coming, nothing is.
func TestReleaseWhenQuiet(t *testing.T) {
	released := func() uint64 {
		s := []runtimemetrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		runtimemetrics.Read(s)
		return s[0].Value.Uint64()
	}
	debugGC := func() { runtime.GC() } // garbage becomes free (not released) memory
	a := &Agent{changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.releaseWhenQuiet(ctx)

	for i := 0; i < 64; i++ {
		sink = append(sink, make([]byte, 1<<20))
	}
	sink = nil
	debugGC()
	before := released()
	// Changes every half second: never quiet long enough.
	for i := 0; i < 6; i++ {
		a.changed <- struct{}{}
		time.Sleep(quietBeforeRelease / 4)
	}
	if got := released(); got > before+32<<20 {
		t.Fatalf("released %d MiB while changes kept coming", (got-before)>>20)
	}
	time.Sleep(quietBeforeRelease + time.Second)
	if got := released(); got < before+32<<20 {
		t.Fatalf("released %d MiB after a quiet period, want the 64 MiB of garbage", (got-before)>>20)
	}
}

// TestSettleGC: the steady state collects at steadyGCPercent, unless the environment chose.
func TestSettleGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	settleGC()
	if got := debug.SetGCPercent(100); got != steadyGCPercent {
		t.Fatalf("GC percent %d, want %d", got, steadyGCPercent)
	}
	t.Setenv("GOGC", "200")
	settleGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent %d with GOGC set, want it left alone (100)", got)
	}
}
