package agent

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/command"
	"github.com/netwarden/netwarden/internal/kernel/kernelwatch"
)

// legacyPollInterval is how often the shapes of iptables-legacy tables are read: a few
// getsockopt calls, no rules copied.
const legacyPollInterval = 200 * time.Millisecond

// watchedFeature is a sync loop and the netfilter tables its rules live in.
type watchedFeature struct {
	loop   *syncLoop
	tables []dataplane.KernelTable
}

func (f watchedFeature) owns(t dataplane.KernelTable) bool {
	return slices.ContainsFunc(f.tables, func(o dataplane.KernelTable) bool { return o.Family == t.Family && o.Name == t.Name })
}

// watchKernel makes each feature verify its rules as soon as another process changes one of
// its tables (an admin's `nft flush ruleset`, a tool restoring whole tables, a rule inserted
// ahead of our jump), instead of at its next resync. A change that broke nothing costs one
// verify; one that did is repaired by a full sync at once. nf_tables tables (nftables and
// iptables-nft) are watched through the kernel's notifications; iptables-legacy tables by
// polling their shape (see kernelwatch.LegacyTable). ipset contents have neither and rely on
// the resync period, as does a legacy rule replaced by one of the same size.
func (a *Agent) watchKernel(ctx context.Context) {
	var feats []watchedFeature
	tablesOf := func(parts ...any) []dataplane.KernelTable {
		var out []dataplane.KernelTable
		for _, p := range parts {
			if kt, ok := p.(dataplane.KernelTables); ok { // a nil Guard is no KernelTables
				out = append(out, kt.KernelTables()...)
			}
		}
		return out
	}
	if a.policy != nil {
		parts := []any{a.np.Backend, a.np.Guard}
		if a.domains != nil {
			parts = append(parts, a.domains.learner)
		}
		feats = append(feats, watchedFeature{a.policy, tablesOf(parts...)})
	}
	if a.masq != nil {
		feats = append(feats, watchedFeature{a.masq.loop, tablesOf(a.cfg.Masquerade.Backend)})
	}
	var nf, legacy []dataplane.KernelTable
	for _, f := range feats {
		for _, t := range f.tables {
			switch {
			case t.Legacy && !slices.Contains(legacy, t):
				legacy = append(legacy, t)
			case !t.Legacy && !slices.Contains(nf, t):
				nf = append(nf, t)
			}
		}
	}
	changed := func(tables []dataplane.KernelTable) {
		for _, f := range feats {
			if slices.ContainsFunc(tables, f.owns) {
				f.loop.kernelChanged()
			}
		}
	}
	if len(legacy) > 0 {
		p := &legacyPoller{tables: legacy}
		a.legacy.Store(p)
		go p.run(ctx, a, changed)
	}
	if len(nf) > 0 {
		a.watchNFTables(ctx, nf, changed)
	}
}

// watchNFTables reads the nf_tables notifications until ctx is done.
func (a *Agent) watchNFTables(ctx context.Context, tables []dataplane.KernelTable, changed func([]dataplane.KernelTable)) {
	watched := make([]kernelwatch.Table, len(tables))
	for i, t := range tables {
		watched[i] = kernelwatch.Table{Family: t.Family, Name: t.Name}
	}
	self := ownCommand()
	w, err := kernelwatch.Open(kernelwatch.Config{Tables: watched, Ours: func(pid int, comm string, gen uint32) bool {
		return comm == self || command.Ran(pid, comm, gen)
	}})
	if err != nil {
		a.log.Warn("cannot watch the kernel's nf_tables notifications; other processes' changes are found at the resync period", "err", err)
		return
	}
	a.log.Info("watching the kernel's nf_tables notifications for other processes' changes to our tables", "tables", len(tables))
	err = w.Run(ctx, func(c kernelwatch.Change) {
		if c.Lost {
			a.log.Warn("kernel change notifications were lost; verifying the rules")
		} else {
			names := make([]string, len(c.Tables))
			for i, t := range c.Tables {
				names[i] = t.String()
			}
			a.log.Info("another process changed our tables", "process", c.Process, "pid", c.PID, "tables", strings.Join(names, ", "))
		}
		touched := make([]dataplane.KernelTable, len(c.Tables))
		for i, t := range c.Tables {
			touched[i] = dataplane.KernelTable{Family: t.Family, Name: t.Name}
		}
		changed(touched)
	})
	if err != nil && ctx.Err() == nil {
		a.log.Error("watching the kernel's nf_tables notifications stopped; other processes' changes are found at the resync period", "err", err)
	}
}

// legacyPoller notices changes of iptables-legacy tables by their shape. The agent's own
// writes change it too: after each of them the loops rebaseline it (accept), so that only
// changes made outside a write of ours cost a verify.
type legacyPoller struct {
	tables []dataplane.KernelTable
	mu     sync.Mutex
	seen   map[dataplane.KernelTable]kernelwatch.LegacyShape
}

func (p *legacyPoller) read() map[dataplane.KernelTable]kernelwatch.LegacyShape {
	out := make(map[dataplane.KernelTable]kernelwatch.LegacyShape, len(p.tables))
	for _, t := range p.tables {
		if s, err := kernelwatch.LegacyTable(t.Family == "ip6", t.Name); err == nil {
			out[t] = s
		}
	}
	return out
}

// accept takes the tables as they are now as the agent's own. Reads happen under the lock, so
// that a poll's older read never overrides a newer accept.
func (p *legacyPoller) accept() {
	p.mu.Lock()
	p.seen = p.read()
	p.mu.Unlock()
}

func (p *legacyPoller) run(ctx context.Context, a *Agent, changed func([]dataplane.KernelTable)) {
	a.log.Info("polling iptables-legacy tables for other processes' changes", "interval", legacyPollInterval, "tables", len(p.tables))
	t := time.NewTicker(legacyPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		cur := p.read()
		var touched []dataplane.KernelTable
		for tbl, s := range cur {
			if old, ok := p.seen[tbl]; ok && old != s {
				touched = append(touched, tbl)
			}
		}
		if p.seen == nil || len(touched) > 0 {
			p.seen = cur
		}
		p.mu.Unlock()
		if len(touched) > 0 {
			a.log.Info("another process changed our iptables-legacy tables", "tables", len(touched))
			changed(touched)
		}
	}
}

// kernelWritten tells the legacy poller, if any, that the agent itself just changed its tables.
func (a *Agent) kernelWritten() {
	if p := a.legacy.Load(); p != nil {
		p.accept()
	}
}

// ownCommand is this process's command name as the kernel reports it.
func ownCommand() string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
