package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/netwarden/netwarden/internal/kernel/conntrack"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// DefaultDenyMark is the conntrack mark bit of established flows a policy now denies.
const DefaultDenyMark = 0x20000000

// Why a mark and not a delete: the rules accept "ct state established" before any policy
// judges a packet, so an established flow outlives the policy that now denies it. Deleting
// its conntrack entry looks enough but is not: the next packet of the flow creates a new
// entry, and when that packet goes the other way (the server's next segment or datagram, or
// a mid-stream TCP segment picked up by nf_conntrack_tcp_loose) the policy judges it as a
// connection from the server to the client, which it usually allows, and the client's
// packets then pass as its replies: the flow goes on. Turning tcp_loose off would not help
// UDP, and would break every flow whose entry was lost for another reason (a full table, an
// agent that flushed it). So the entry stays, with the deny bit set in its mark, and the
// guard drops every packet of a marked entry, both ways, ahead of the established accept: the
// flow stops for good whoever sends next, and no new entry can take its place while it lives.
// A later change that allows the flow again clears the bit. Flows not judged by the new rules
// (no local pod isolated on either side) are never touched, nor are allowed ones.

// flowJudge re-judges established flows after the syncs that may have changed their verdicts,
// beside the sync loop rather than in it. The walk reads the kernel's whole conntrack table
// (8-10 ms for 262,144 buckets even when empty, far more on a busy node), and new connections
// are judged by the rules from the moment the transaction commits: holding the next change of
// rules back for the walk would delay every verdict to protect a few flows. The walk always
// uses the latest Ruleset, and Status reports the Generation it covers (EstablishedGeneration),
// so a writer that needs its established flows cut waits for that.
type flowJudge struct {
	a *Agent
	// enabled: a guard drops the flows carrying DenyMark; without one, nothing is re-judged.
	enabled bool
	wake    chan struct{}
	ctSock  *nftnl.Raw // the worker's only
	// judge is pass; tests replace it.
	judge func(*policy.Ruleset) (anyMarked bool, err error)
	clock clock.Clock

	mu  sync.Mutex
	rs  *policy.Ruleset // the latest Ruleset the kernel holds, and its Generation
	gen uint64
	// need: a change since the last pass may have turned an allowed flow into a denied one
	// (or back, when some flow carries the bit).
	need      bool
	busy      bool // the worker has work or is at it: it publishes, not submit
	anyMarked bool // the last pass left some entry with the deny bit
}

func newFlowJudge(a *Agent) *flowJudge {
	j := &flowJudge{a: a, enabled: a.guard() != nil && a.np.DenyMark != 0, wake: make(chan struct{}, 1), clock: clock.RealClock{}}
	j.judge = j.pass
	return j
}

// passSpacing bounds the share of a core the walks take when changes that need one come back
// to back, as in a churn of pod changes across a large cluster, where most syncs remove some
// address from a peer set: a pass starts no sooner than passSpacing times the last one's
// duration after it ended, so the walks take at most a fifth of a core. A change that finds
// the judge idle is walked at once.
const passSpacing = 4

// submit tells the judge that the kernel holds rs, compiled from Generation gen. changed: the
// rules changed; narrowed: some verdict may have gone from allow to deny (or the rules were
// replaced whole, which says nothing of what came before).
func (j *flowJudge) submit(rs *policy.Ruleset, gen uint64, changed, narrowed bool) {
	if d := j.a.domains; d != nil && rs != nil && len(rs.DomainSets) > 0 {
		// A flow to an address learned from DNS was admitted while it was learned; it stays
		// up after the address expires (see domains.Config.History).
		rs = rs.WithDomains(d.learner)
	}
	j.mu.Lock()
	j.rs, j.gen = rs, gen
	if j.enabled && (narrowed || changed && j.anyMarked) {
		j.need = true
	}
	if !j.busy && !j.need {
		// No verdict went from allow to deny, and no flow is flagged: the last pass covers
		// this Generation too.
		j.mu.Unlock()
		j.published(gen, nil)
		return
	}
	j.busy = true
	j.mu.Unlock()
	j.signal()
}

func (j *flowJudge) signal() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// run passes over the conntrack table whenever a submitted change needs it, until ctx is done.
// A failed pass is retried with backoff; Generation stays where the last good pass left it.
func (j *flowJudge) run(ctx context.Context) {
	retry := time.NewTimer(0)
	<-retry.C
	backoff := time.Duration(0)
	var lastEnd time.Time
	var lastTook time.Duration
	var paced <-chan time.Time // set while a due pass waits out passSpacing
	for {
		select {
		case <-ctx.Done():
			return
		case <-j.wake:
		case <-retry.C:
		case <-paced:
			paced = nil
		}
		j.mu.Lock()
		rs, gen, due := j.rs, j.gen, j.need
		if due && !lastEnd.IsZero() {
			if wait := lastEnd.Add(passSpacing * lastTook).Sub(j.clock.Now()); wait > 0 {
				j.mu.Unlock()
				if paced == nil {
					paced = j.clock.After(wait)
				}
				continue
			}
		}
		j.need = false
		j.mu.Unlock()
		if due {
			// The status change that made this pass due woke its readers (a long poll of
			// /status) just before: let them run first. The walk is milliseconds of CPU, and on
			// a small node it would otherwise hold back the answer that the kernel holds the
			// change, which does not wait for the walk.
			runtime.Gosched()
			start := j.clock.Now()
			marked, err := j.judge(rs)
			lastEnd = j.clock.Now()
			lastTook = lastEnd.Sub(start)
			if err != nil {
				j.mu.Lock()
				j.need = true
				j.mu.Unlock()
				j.a.metrics.establishedErrors.Inc()
				backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
				j.a.log.Error("re-judging established flows failed", "err", err, "retryIn", backoff)
				j.published(0, err)
				retry.Reset(backoff)
				continue
			}
			backoff = 0
			j.mu.Lock()
			j.anyMarked = marked
			j.mu.Unlock()
		}
		j.published(gen, nil)
		j.mu.Lock()
		if j.gen != gen && j.anyMarked {
			// The rules changed during the pass, and some flow carries the bit: the new
			// rules may allow it again.
			j.need = true
		}
		if j.gen == gen && !j.need {
			j.busy = false
		} else {
			j.signal()
		}
		j.mu.Unlock()
	}
}

// published records on the status that established flows are judged by Generation gen's rules
// (gen 0 with err: a pass failed, and the Generation stays).
func (j *flowJudge) published(gen uint64, err error) {
	j.a.status.update(&j.a.status.policy, func(fs *statusapi.FeatureStatus) {
		if err != nil {
			fs.EstablishedError = err.Error()
			return
		}
		fs.EstablishedGeneration, fs.EstablishedError = gen, ""
	})
	if err == nil {
		j.a.metrics.appliedGeneration.WithLabelValues("established-flows").Set(float64(gen))
	}
}

// pass re-judges every conntrack entry that concerns an isolated local pod (or carries the
// deny bit) with rs, and sets or clears the deny bit where the verdict differs. It reports
// whether some entry carries the bit afterwards.
func (j *flowJudge) pass(rs *policy.Ruleset) (anyMarked bool, err error) {
	mask := j.a.np.DenyMark
	j.mu.Lock()
	wasMarked := j.anyMarked
	j.mu.Unlock()
	if !wasMarked && !hasIsolation(rs) {
		return false, nil
	}
	start := time.Now()
	if j.ctSock == nil {
		s, err := nftnl.DialRaw()
		if err != nil {
			return wasMarked, fmt.Errorf("established flows: %w", err)
		}
		j.ctSock = s
	}
	flows, err := conntrack.Flows(j.ctSock)
	if err != nil {
		return wasMarked, fmt.Errorf("established flows: %w", err)
	}
	local := nodeAddrs()
	var deny, allow []conntrack.Flow
	marked := 0
	for _, f := range flows {
		was := f.Mark&mask != 0
		if !f.Src.IsValid() || !was && !concerns(rs, f) {
			continue
		}
		denied := judgeFlow(rs, f, local)
		switch {
		case denied && !was:
			deny = append(deny, f)
		case !denied && was:
			allow = append(allow, f)
		}
		if denied {
			marked++
		}
	}
	nd, err := conntrack.SetMarkBits(j.ctSock, deny, mask, true)
	if err != nil {
		return true, fmt.Errorf("established flows: %w", err)
	}
	na, err := conntrack.SetMarkBits(j.ctSock, allow, mask, false)
	if err != nil {
		return true, fmt.Errorf("established flows: %w", err)
	}
	if nd+na > 0 {
		j.a.log.Info("established flows re-judged", "denied", nd, "allowedAgain", na, "entries", len(flows),
			"took", time.Since(start).Round(time.Microsecond))
	}
	return marked > 0, nil
}

func hasIsolation(rs *policy.Ruleset) bool {
	for _, d := range []map[policy.Direction]map[netip.Addr]string{rs.Dispatch, rs.Admin.Dispatch, rs.Baseline.Dispatch} {
		if len(d[policy.Ingress])+len(d[policy.Egress]) > 0 {
			return true
		}
	}
	return false
}

func judged(rs *policy.Ruleset, dir policy.Direction, addr netip.Addr) bool {
	for _, d := range []map[policy.Direction]map[netip.Addr]string{rs.Dispatch, rs.Admin.Dispatch, rs.Baseline.Dispatch} {
		if _, ok := d[dir][addr]; ok {
			return true
		}
	}
	return false
}

// flowDst is the destination the rules judged: after DNAT, the reply's source.
func flowDst(f conntrack.Flow) (netip.Addr, uint16) {
	if f.ReplySrc.IsValid() {
		return f.ReplySrc.Unmap(), f.ReplySrcPort
	}
	return f.Dst.Unmap(), f.DstPort
}

func concerns(rs *policy.Ruleset, f conntrack.Flow) bool {
	dst, _ := flowDst(f)
	return judged(rs, policy.Egress, f.Src.Unmap()) || judged(rs, policy.Ingress, dst)
}

// judgeFlow reports whether rs denies the flow, as the kernel would judge its first packet:
// egress of a local pod source, then ingress of a local pod destination unless the node
// itself sent it (its packets leave through output, which no policy chain sees).
func judgeFlow(rs *policy.Ruleset, f conntrack.Flow, nodeLocal map[netip.Addr]bool) bool {
	src := f.Src.Unmap()
	dst, port := flowDst(f)
	proto := protocolName(f.Protocol)
	if judged(rs, policy.Egress, src) && !rs.Judge(policy.Egress, src, dst, proto, port).Allowed {
		return true
	}
	if !nodeLocal[src] && judged(rs, policy.Ingress, dst) && !rs.Judge(policy.Ingress, dst, src, proto, port).Allowed {
		return true
	}
	return false
}

func protocolName(p uint8) policy.Protocol {
	switch p {
	case unix.IPPROTO_TCP:
		return policy.TCP
	case unix.IPPROTO_UDP:
		return policy.UDP
	case unix.IPPROTO_SCTP:
		return policy.SCTP
	}
	// No policy port names another protocol, so only rules without ports match it, as in
	// the kernel.
	return policy.Protocol(fmt.Sprintf("ip-proto-%d", p))
}

// nodeAddrs returns the addresses of this network namespace's interfaces.
func nodeAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out
}
