package agent

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// TestFlowJudgeCoversEachGeneration: the Generation reported for established flows never runs
// ahead of a pass that a narrowing change needs, follows at once when nothing narrowed, is
// extended by a pass to the changes that came during it, stays put while a pass fails, and
// flagged flows bring a pass after any change of the rules.
func TestFlowJudgeCoversEachGeneration(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	a.status.policy = &statusapi.FeatureStatus{}
	j := &flowJudge{a: a, enabled: true, wake: make(chan struct{}, 1), clock: clock.RealClock{}}
	type call struct {
		rs    *policy.Ruleset
		reply chan passReply
	}
	calls := make(chan call)
	j.judge = func(rs *policy.Ruleset) (bool, error) {
		c := call{rs, make(chan passReply)}
		calls <- c
		r := <-c.reply
		return r.marked, r.err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go j.run(ctx)

	gen := func() (uint64, string) {
		p, _, _ := a.status.get()
		return p.EstablishedGeneration, p.EstablishedError
	}
	waitGen := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if g, _ := gen(); g == want {
				return
			}
			if time.Now().After(deadline) {
				g, e := gen()
				t.Fatalf("established generation %d (error %q), want %d", g, e, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	nextPass := func(want *policy.Ruleset) call {
		t.Helper()
		select {
		case c := <-calls:
			if c.rs != want {
				t.Fatalf("pass judged by another Ruleset than the latest")
			}
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no pass")
		}
		return call{}
	}
	noPass := func() {
		t.Helper()
		select {
		case <-calls:
			t.Fatal("a pass that nothing needs")
		case <-time.After(50 * time.Millisecond):
		}
	}
	rs := func() *policy.Ruleset { return &policy.Ruleset{} }

	r1 := rs()
	j.submit(r1, 1, true, false)
	waitGen(1) // nothing narrowed, nothing flagged: no pass
	noPass()

	r2 := rs()
	j.submit(r2, 2, true, true)
	c := nextPass(r2)
	if g, _ := gen(); g != 1 {
		t.Fatalf("generation %d reported while its pass runs", g)
	}
	// A change that narrows nothing, during the pass: it waits for the pass, then is covered
	// by it.
	r3 := rs()
	j.submit(r3, 3, true, false)
	if g, _ := gen(); g != 1 {
		t.Fatalf("generation %d reported while an earlier pass runs", g)
	}
	c.reply <- passReply{}
	waitGen(3)
	noPass()

	// A failed pass leaves the generation and says why; the retry publishes.
	r4 := rs()
	j.submit(r4, 4, true, true)
	c = nextPass(r4)
	c.reply <- passReply{err: errors.New("conntrack unreachable")}
	deadline := time.Now().Add(5 * time.Second)
	for _, e := gen(); e == ""; _, e = gen() {
		if time.Now().After(deadline) {
			t.Fatal("failed pass not reported")
		}
		time.Sleep(time.Millisecond)
	}
	if g, _ := gen(); g != 3 {
		t.Fatalf("generation %d after a failed pass, want 3", g)
	}
	c = nextPass(r4)
	// A widening change during the pass that flags flows: it may allow them again, so the
	// pass is followed by another.
	r5 := rs()
	j.submit(r5, 5, true, false)
	c.reply <- passReply{marked: true}
	c = nextPass(r5)
	if g, e := gen(); g != 4 || e != "" {
		t.Fatalf("generation %d, error %q after the retry, want 4 and none", g, e)
	}
	c.reply <- passReply{marked: true}
	waitGen(5)

	// Flows carry the bit: a change of rules, even a widening one, is judged (it may allow
	// them again); a sync that changed nothing is not.
	r6 := rs()
	j.submit(r6, 6, true, false)
	c = nextPass(r6)
	c.reply <- passReply{}
	waitGen(6)
	j.submit(r6, 7, false, false)
	waitGen(7)
	noPass()
}

type passReply struct {
	marked bool
	err    error
}

// TestFlowJudgeDisabled: without a guard, established flows are never judged, and their
// generation follows the rules'.
func TestFlowJudgeDisabled(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	a.status.policy = &statusapi.FeatureStatus{}
	a.flows = newFlowJudge(a)
	a.flows.judge = func(*policy.Ruleset) (bool, error) { t.Fatal("judged"); return false, nil }
	a.flows.submit(&policy.Ruleset{}, 7, true, true)
	if p, _, _ := a.status.get(); p.EstablishedGeneration != 7 {
		t.Fatalf("established generation %d, want 7", p.EstablishedGeneration)
	}
}

// TestFlowJudgeSpacesPasses: when changes that need a pass come back to back, the next pass
// waits passSpacing times the last one's duration after it ended (on a fake clock), and then
// covers every change that came meanwhile; a change that finds the judge idle is walked at once.
func TestFlowJudgeSpacesPasses(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	a.status.policy = &statusapi.FeatureStatus{}
	fake := testingclock.NewFakeClock(time.Unix(1000, 0))
	j := &flowJudge{a: a, enabled: true, wake: make(chan struct{}, 1), clock: fake}
	const walk = 10 * time.Millisecond
	passes := make(chan *policy.Ruleset, 10)
	j.judge = func(rs *policy.Ruleset) (bool, error) {
		fake.Step(walk) // the walk takes this long
		passes <- rs
		return false, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go j.run(ctx)
	waitGen := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			p, _, _ := a.status.get()
			if p.EstablishedGeneration == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("established generation %d, want %d", p.EstablishedGeneration, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	noPass := func(when string) {
		t.Helper()
		select {
		case <-passes:
			t.Fatalf("%s: a pass before its spacing ran out", when)
		case <-time.After(50 * time.Millisecond):
		}
	}

	r1 := &policy.Ruleset{}
	j.submit(r1, 1, true, true)
	if got := <-passes; got != r1 {
		t.Fatal("the first pass judged another Ruleset")
	}
	waitGen(1)
	// Two more narrowing changes at once: both wait for one pass, 40 ms after the first ended.
	r2, r3 := &policy.Ruleset{}, &policy.Ruleset{}
	j.submit(r2, 2, true, true)
	j.submit(r3, 3, true, true)
	noPass("right after")
	for !fake.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	fake.Step(passSpacing*walk - time.Millisecond)
	noPass("a millisecond before")
	fake.Step(time.Millisecond)
	select {
	case got := <-passes:
		if got != r3 {
			t.Fatal("the spaced pass did not judge by the latest Ruleset")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no pass once the spacing ran out")
	}
	waitGen(3)
	noPass("after the spaced pass")
	// Idle long enough: the next change is walked at once.
	fake.Step(time.Second)
	r4 := &policy.Ruleset{}
	j.submit(r4, 4, true, true)
	select {
	case <-passes:
	case <-time.After(5 * time.Second):
		t.Fatal("a change that found the judge idle waited")
	}
	waitGen(4)
}
