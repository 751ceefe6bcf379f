package domains

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/nfqueue"
	"github.com/netwarden/netwarden/internal/policy"
)

// Config is how the learner runs.
type Config struct {
	// Queue is the NFQUEUE number the replies are queued to.
	Queue uint16
	// Grace is added to every answer's TTL: an address stays admitted for TTL + Grace.
	Grace time.Duration
	// History is how long after its timeout an address still counts as admitted when
	// established flows are judged again after a policy change: a connection made while the
	// address was admitted stays up after it expires.
	History time.Duration
	// Log receives the learner's warnings (writes that failed, a queue that broke).
	Log *slog.Logger
}

// Stats are the learner's counts since it started, for /metrics.
type Stats struct {
	// Names and Addresses are the names and (set, address) pairs admitted now.
	Names, Addresses int
	// Believed counts answers read from a believed server; Admitting those that admitted
	// some address; Unreadable replies that were no DNS response it could read.
	Believed, Admitting, Unreadable uint64
	// Refused counts UDP replies from port 53 that no believed server sent (the kernel counts
	// them; they are never read).
	Refused uint64
	// Held is how long answers were held (read from the queue → released), for the histogram.
	Held []time.Duration
}

// Learner learns addresses from answers and has the backend hold them. It implements
// policy.LearnedSource and policy.DomainAddrs.
type Learner struct {
	cfg     Config
	backend policy.DomainLearning
	now     func() time.Time

	// mu guards what the reading of answers needs; it is never held across the kernel, so
	// a held reply never waits for a netlink round trip other than its own write.
	mu       sync.Mutex
	patterns map[string]string // DomainSet name → pattern
	sets     map[string]map[netip.Addr]*learned
	names    map[string]time.Time // names admitted, until when
	servers  []netip.Addr
	queue    *nfqueue.Conn
	closed   bool

	// steerMu guards the queue rules in the kernel (Update, Verify, Stats, Close).
	steerMu sync.Mutex
	steer   steering

	believed, admitting, unreadable atomic.Uint64
	heldMu                          sync.Mutex
	held                            []time.Duration
}

type learned struct {
	expires time.Time
	comment string
}

var (
	_ policy.LearnedSource = (*Learner)(nil)
	_ policy.DomainAddrs   = (*Learner)(nil)
)

// New returns a learner writing through backend, which it registers as its source.
func New(cfg Config, backend policy.DomainLearning) *Learner {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	l := &Learner{cfg: cfg, backend: backend, now: time.Now,
		patterns: map[string]string{}, sets: map[string]map[netip.Addr]*learned{}, names: map[string]time.Time{}}
	l.steer.queue = cfg.Queue
	backend.SetLearnedSource(l)
	return l
}

// Update sets the DomainSets to learn for and the servers to believe. The queue rules are in
// the kernel only while both are non-empty; the queue is bound first, so no reply passes
// unread once the rules are there.
func (l *Learner) Update(sets map[string]*policy.DomainSet, servers []netip.Addr) error {
	servers = slices.Clone(servers)
	slices.SortFunc(servers, netip.Addr.Compare)
	servers = slices.Compact(servers)
	l.steerMu.Lock()
	defer l.steerMu.Unlock()
	on, err := l.update(sets, servers)
	if err != nil {
		return err
	}
	return l.steer.sync(servers, on)
}

// update records the patterns and servers and binds the queue when the rules are to be on.
func (l *Learner) update(sets map[string]*policy.DomainSet, servers []netip.Addr) (on bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false, errors.New("the learner is closed")
	}
	patterns := make(map[string]string, len(sets))
	for name, s := range sets {
		patterns[name] = s.Pattern
	}
	if !maps.Equal(patterns, l.patterns) {
		for name := range l.sets {
			if _, ok := patterns[name]; !ok {
				delete(l.sets, name)
			}
		}
		l.patterns = patterns
	}
	l.servers = servers
	on = len(patterns) > 0 && len(servers) > 0
	if on && l.queue == nil {
		q, err := nfqueue.Open(l.cfg.Queue, 4096)
		if err != nil {
			return false, err
		}
		l.queue = q
		go l.read(q)
	}
	return on, nil
}

// Close removes the queue rules and unbinds the queue; a later Update does nothing. Learned
// addresses stay in the kernel until their timeouts end.
func (l *Learner) Close() error {
	l.steerMu.Lock()
	defer l.steerMu.Unlock()
	err := l.steer.cleanup()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.queue != nil {
		l.queue.Close()
		l.queue = nil
	}
	return err
}

// read holds each queued reply until its addresses are in the kernel.
func (l *Learner) read(q *nfqueue.Conn) {
	var streams tcpStreams
	for {
		pkts, err := q.Receive()
		if err != nil {
			if errors.Is(err, nfqueue.ErrLost) {
				l.cfg.Log.Warn("DNS replies passed unread: the queue's socket buffer was full", "err", err)
				continue
			}
			l.lost(q, err)
			return
		}
		// The replies that came together are learned together: one kernel transaction for
		// all their addresses, then each released.
		began := l.now()
		var elems []policy.LearnedElement
		for _, p := range pkts {
			elems = append(elems, l.handle(p.Payload, &streams)...)
		}
		l.write(elems)
		for _, p := range pkts {
			if err := q.Accept(p.ID); err != nil {
				l.cfg.Log.Warn("releasing a DNS reply", "err", err)
			}
		}
		held := l.now().Sub(began)
		l.heldMu.Lock()
		for range pkts {
			if len(l.held) < 1<<16 {
				l.held = append(l.held, held)
			}
		}
		l.heldMu.Unlock()
	}
}

// lost unbinds q after an error of its reading, unless Close did: the replies then pass
// unread (bypass) rather than wait for a reader that is gone (those held at that moment are
// dropped by the kernel, and asked again); the next Update binds again.
func (l *Learner) lost(q *nfqueue.Conn, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.queue == q {
		l.cfg.Log.Error("reading the DNS replies queue; unbinding it until the next sync", "err", err)
		q.Close()
		l.queue = nil
	}
}

// write has the backend hold elems. They are recorded first (learn), written second: a sync
// creating one of their sets meanwhile takes them from Learned (see policy.DomainLearning).
func (l *Learner) write(elems []policy.LearnedElement) {
	if len(elems) == 0 {
		return
	}
	if err := l.backend.Admit(elems); err != nil {
		l.cfg.Log.Warn("writing learned addresses into the kernel", "addresses", len(elems), "err", err)
		l.forget(elems)
	}
}

// forget drops what learn recorded for elems that may not be in the kernel, so that the next
// answer giving them writes them again rather than taking them for held.
func (l *Learner) forget(elems []policy.LearnedElement) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range elems {
		if cur := l.sets[e.Set][e.Addr]; cur != nil && cur.comment == e.Comment {
			delete(l.sets[e.Set], e.Addr)
		}
	}
}

// handle learns from one queued packet and returns what to write.
func (l *Learner) handle(pkt []byte, streams *tcpStreams) []policy.LearnedElement {
	seg, ok := parseSegment(pkt)
	if !ok {
		l.unreadable.Add(1)
		return nil
	}
	msgs := [][]byte{seg.payload}
	if seg.tcp {
		msgs = streams.add(seg)
	}
	var elems []policy.LearnedElement
	for _, m := range msgs {
		a, err := parseAnswer(m)
		if err != nil {
			l.unreadable.Add(1)
			continue
		}
		elems = append(elems, l.learn(a, seg.src.Addr())...)
	}
	return elems
}

// learn records the addresses of an answer from server for every pattern a name on its chain
// matches, and returns the elements to write.
func (l *Learner) learn(a answer, server netip.Addr) []policy.LearnedElement {
	now := l.now()
	l.mu.Lock()
	if !slices.Contains(l.servers, server) { // the kernel queues only theirs; a changed list races
		l.mu.Unlock()
		return nil
	}
	l.believed.Add(1)
	var elems []policy.LearnedElement
	for set, pattern := range l.patterns {
		matched := ""
		for _, n := range a.names {
			if Matches(pattern, n) {
				matched = n
				break
			}
		}
		if matched == "" {
			continue
		}
		m := l.sets[set]
		if m == nil {
			m = map[netip.Addr]*learned{}
			l.sets[set] = m
		}
		for _, aa := range a.addrs {
			exp := now.Add(aa.ttl + l.cfg.Grace)
			e := m[aa.addr]
			if e != nil && e.expires.After(exp) {
				continue // a longer answer for another name still holds it
			}
			comment := fmt.Sprintf("%s via %s from %s ttl %ds", printable(a.question), printable(matched), server, int(aa.ttl/time.Second))
			if len(comment) > 120 {
				comment = comment[:120]
			}
			m[aa.addr] = &learned{expires: exp, comment: comment}
			if until := l.names[matched]; until.Before(exp) {
				l.names[matched] = exp
			}
			elems = append(elems, policy.LearnedElement{Set: set, Addr: aa.addr, Timeout: exp.Sub(now), Comment: comment})
		}
	}
	l.mu.Unlock()
	if len(elems) > 0 {
		l.admitting.Add(1)
	}
	return elems
}

// printable spells a DNS name for an element's comment with only what every tool that lists
// it reads back as written (a label may hold any byte: a quote would break nft's parsing of a
// transaction carrying the comment): other bytes become "?".
func printable(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' || c == '*') {
			b[i] = '?'
		}
	}
	return string(b)
}

// Verify reports how the kernel's queue rules differ from what Update wrote; the next Update
// writes them again.
func (l *Learner) Verify() error {
	l.steerMu.Lock()
	defer l.steerMu.Unlock()
	return l.steer.verify()
}

// KernelTables implements dataplane.KernelTables: the queue rules' tables.
func (l *Learner) KernelTables() []dataplane.KernelTable {
	return []dataplane.KernelTable{{Family: "ip", Name: SteerTable}, {Family: "ip6", Name: SteerTable}}
}

// Restore starts the learner from what the kernel holds (a restarted agent's predecessor
// learned it), before the first sync replaces the sets.
func (l *Learner) Restore(elems []policy.LearnedElement) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range elems {
		m := l.sets[e.Set]
		if m == nil {
			m = map[netip.Addr]*learned{}
			l.sets[e.Set] = m
		}
		exp := now.Add(e.Timeout)
		m[e.Addr] = &learned{expires: exp, comment: e.Comment}
		// The comment says which name admitted it ("QUESTION via NAME from ...").
		if _, rest, ok := strings.Cut(e.Comment, " via "); ok {
			if name, _, ok := strings.Cut(rest, " "); ok && l.names[name].Before(exp) {
				l.names[name] = exp
			}
		}
	}
}

// Learned implements policy.LearnedSource.
func (l *Learner) Learned(set string) []policy.LearnedElement {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []policy.LearnedElement
	for addr, e := range l.sets[set] {
		if left := e.expires.Sub(now); left > 0 {
			out = append(out, policy.LearnedElement{Set: set, Addr: addr, Timeout: left, Comment: e.comment})
		}
	}
	return out
}

// Admits implements policy.DomainAddrs for the judgement of established flows: an address
// admitted now, or within History before now.
func (l *Learner) Admits(set string, addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.sets[set][addr.Unmap()]
	return e != nil && l.now().Before(e.expires.Add(l.cfg.History))
}

// maxHistory bounds the expired addresses kept for the judgement of established flows
// (about 100 bytes each); beyond it, those that expired first are forgotten first.
const maxHistory = 100_000

// Prune forgets what expired more than History ago, and the oldest expired beyond
// maxHistory; run periodically.
func (l *Learner) Prune() {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	type expired struct {
		set  string
		addr netip.Addr
		at   time.Time
	}
	var old []expired
	for set, m := range l.sets {
		for addr, e := range m {
			switch {
			case now.After(e.expires.Add(l.cfg.History)):
				delete(m, addr)
			case now.After(e.expires):
				e.comment = "" // only explain reads it, from the kernel, while it is there
				old = append(old, expired{set, addr, e.expires})
			}
		}
		if len(m) == 0 {
			delete(l.sets, set)
		}
	}
	if len(old) > maxHistory {
		slices.SortFunc(old, func(a, b expired) int { return a.at.Compare(b.at) })
		for _, e := range old[:len(old)-maxHistory] {
			delete(l.sets[e.set], e.addr)
		}
	}
	for n, until := range l.names {
		if now.After(until) {
			delete(l.names, n)
		}
	}
}

// Run prunes until ctx ends, then closes the learner.
func (l *Learner) Run(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := l.Close(); err != nil {
				l.cfg.Log.Warn("removing the DNS queue rules", "err", err)
			}
			return
		case <-t.C:
			l.Prune()
		}
	}
}

// Stats returns the counts, and the hold times since the last call.
func (l *Learner) Stats() Stats {
	now := l.now()
	st := Stats{Believed: l.believed.Load(), Admitting: l.admitting.Load(), Unreadable: l.unreadable.Load()}
	l.mu.Lock()
	for _, until := range l.names {
		if now.Before(until) {
			st.Names++
		}
	}
	for _, m := range l.sets {
		for _, e := range m {
			if now.Before(e.expires) {
				st.Addresses++
			}
		}
	}
	l.mu.Unlock()
	l.steerMu.Lock()
	st.Refused, _ = l.steer.refused()
	l.steerMu.Unlock()
	l.heldMu.Lock()
	st.Held, l.held = l.held, nil
	l.heldMu.Unlock()
	return st
}
