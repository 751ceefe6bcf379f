package nftables

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/kernel/command"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/setdelta"
)

// The capabilities the agent finds by type assertion.
var (
	_ policy.Backend         = (*Backend)(nil)
	_ policy.DropLogger      = (*Backend)(nil)
	_ policy.PolicyCounters  = (*Backend)(nil)
	_ policy.StagedReporter  = (*Backend)(nil)
	_ dataplane.KernelTables = (*Backend)(nil)
)

// Backend owns table inet netwarden.
type Backend struct {
	nft      knftables.Interface
	renderer Renderer
	// applied is what the kernel held after our last successful transaction; nil forces the
	// next sync to replace the whole table.
	applied *Rendered
	// netlink sends element-only changes over netlink instead of through the nft CLI.
	netlink bool
	conn    nftnl.Conn
	// verifiedHash is a digest of the table as listed at the last drift check; syncedSince
	// records whether we changed the table after that listing.
	verifiedHash string
	syncedSince  bool
	// learned holds what the DomainSets' learner needs (see learned.go).
	learned learnedSets
}

// New connects to nftables in the current network namespace. It fails when nft is missing,
// older than 1.0.1, or not permitted.
func New() (*Backend, error) {
	nft, err := knftables.New(knftables.InetFamily, TableName)
	if err != nil {
		return nil, err
	}
	return &Backend{nft: nft, netlink: true}, nil
}

// NewWithInterface wraps an existing knftables.Interface, such as knftables.NewFake for unit
// tests of rendering.
func NewWithInterface(nft knftables.Interface) *Backend { return &Backend{nft: nft} }

// SetDropLog implements policy.DropLogger. The next sync renders every chain anew.
func (b *Backend) SetDropLog(l *policy.DropLog) {
	b.renderer = b.renderer.anew(func(r *Renderer) { r.log = l })
}

// SetStagedLog implements policy.StagedReporter: the differences the judgement of staged
// policies finds are logged with their StagedLogID, within the limits of l.
func (b *Backend) SetStagedLog(l *policy.DropLog) {
	b.renderer = b.renderer.anew(func(r *Renderer) { r.stagedLog = l })
}

// Name implements policy.Backend.
func (b *Backend) Name() string { return "nftables" }

// Render implements policy.Backend.
func (b *Backend) Render(rs *policy.Ruleset) string { return Dump(Render(rs)) }

// Sync implements policy.Backend.
func (b *Backend) Sync(ctx context.Context, rs *policy.Ruleset) (dataplane.SyncResult, error) {
	want := b.renderer.Render(rs)
	res, err := b.SyncRendered(ctx, want)
	res.Skipped = want.Skipped
	return res, err
}

// FullSync implements policy.Backend.
func (b *Backend) FullSync(ctx context.Context, rs *policy.Ruleset) (dataplane.SyncResult, error) {
	want := b.renderer.Render(rs)
	res, err := b.FullSyncRendered(ctx, want)
	res.Skipped = want.Skipped
	return res, err
}

// SyncRendered makes the kernel hold want, in one transaction. After a successful first sync
// it sends only the difference: element-only changes as one netlink batch, anything else as
// one nft transaction. If a diff fails (for example because someone deleted the table) it
// falls back to a full replace in a new transaction.
func (b *Backend) SyncRendered(ctx context.Context, want *Rendered) (dataplane.SyncResult, error) {
	if b.applied != nil {
		p := diff(b.applied, want)
		if p.empty() {
			return dataplane.SyncResult{Size: want.size()}, nil
		}
		var err error
		ops := p.operations(want)
		release := b.lockIfLearning(b.applied, want)
		if b.netlink && p.netlinkable(want) {
			err = applyNetlink(&b.conn, p, b.applied, want, b.learnedOf)
		} else {
			tx := b.nft.NewTransaction()
			p.writeTx(tx, b.applied, want, b.learnedOf)
			err = command.Tracked("nft", func() error { return b.nft.Run(ctx, tx) })
		}
		release(err == nil)
		if err == nil {
			b.applied = want
			b.syncedSince = true
			return dataplane.SyncResult{Operations: ops, Size: want.size()}, nil
		}
		// The kernel no longer holds what we think; replace everything.
		res, ferr := b.FullSyncRendered(ctx, want)
		res.Fallback = err.Error()
		return res, ferr
	}
	return b.FullSyncRendered(ctx, want)
}

// FullSyncRendered atomically replaces the whole table with want. Established connections survive
// because conntrack state does not live in the table.
func (b *Backend) FullSyncRendered(ctx context.Context, want *Rendered) (res dataplane.SyncResult, err error) {
	release := b.lockIfLearning(nil, want)
	defer func() { release(err == nil) }()
	var fallback string
	if b.netlink && fullNetlinkable(want) {
		// Over netlink, nft's parse and evaluation of megabytes of text is saved (a third of
		// the transaction at the benchmark's scale, and all of its CPU outside the kernel).
		// What netlink cannot write (a range up to the highest address: nft marks it in
		// element data) or a batch the kernel refuses goes through nft, which words the error.
		p := diff(&Rendered{}, want)
		err := applyNetlinkFull(&b.conn, p, want, b.learnedOf)
		if err == nil {
			b.applied = want
			b.syncedSince = true
			return dataplane.SyncResult{Full: true, Operations: p.operations(want), Size: want.size()}, nil
		}
		fallback = "netlink full sync: " + err.Error()
	}
	tx := b.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	writeFull(tx, want, true)
	writeLearned(tx, want, b.learnedOf)
	if err := command.Tracked("nft", func() error { return b.nft.Run(ctx, tx) }); err != nil {
		b.applied = nil
		return dataplane.SyncResult{Full: true, Fallback: fallback}, fmt.Errorf("nftables full sync: %w", err)
	}
	b.applied = want
	b.syncedSince = true
	return dataplane.SyncResult{Full: true, Operations: tx.NumOperations(), Size: want.size(), Fallback: fallback}, nil
}

// tableComment is what `nft list` shows on the table.
const tableComment = "netwarden NetworkPolicy; managed, do not edit"

// fullNetlinkable reports whether a full sync of r can go over netlink as far as its kinds of
// objects go: every chain in structured form, every set of a type with a netlink encoding.
func fullNetlinkable(r *Rendered) bool {
	for _, c := range r.Chains {
		if len(c.specs) != len(c.rules) {
			return false
		}
	}
	for _, s := range r.Sets {
		if _, err := keyType(s.typ); err != nil {
			return false
		}
	}
	return true
}

// WriteFull adds every object of r to tx, assuming an empty table, one element per command.
func WriteFull(tx *knftables.Transaction, r *Rendered) { writeFull(tx, r, false) }

// elementsPerCommand bounds the elements a grouped full sync writes in one command.
const elementsPerCommand = 1024

// writeFull adds every object of r to tx. Grouped, the elements of a set or map go in a few
// commands rather than one each: nft parses and evaluates a command with a thousand elements
// in about the time of a handful of one-element commands, and a full sync is mostly elements
// (22,000 of 27,000 commands at the benchmark's scale; 0.5 s -> 0.25 s in nft). Only the kernel
// gets grouped commands; knftables' Fake, behind Dump, reads one element per command. Interval
// sets stay one element per command: within one command nft rejects ranges that touch or
// overlap, which an ipBlock's set may hold.
func writeFull(tx *knftables.Transaction, r *Rendered, grouped bool) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
	for _, name := range slices.Sorted(maps.Keys(r.Sets)) {
		addSetObject(tx, name, r.Sets[name])
	}
	for _, name := range slices.Sorted(maps.Keys(r.Chains)) {
		addChainObject(tx, name, r.Chains[name])
	}
	for _, name := range slices.Sorted(maps.Keys(r.Chains)) {
		for _, rule := range r.Chains[name].rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: rule})
		}
	}
	// Elements last: verdict map elements reference chains.
	for _, name := range slices.Sorted(maps.Keys(r.Sets)) {
		s := r.Sets[name]
		elems := s.Elements()
		keys := slices.Sorted(maps.Keys(elems))
		if !grouped || s.interval {
			for _, k := range keys {
				tx.Add(element(name, s, k, elems[k]))
			}
			continue
		}
		for chunk := range slices.Chunk(keys, elementsPerCommand) {
			tx.Add(groupedElements(name, s, chunk, elems))
		}
	}
}

// groupedElements is one command adding the elements of keys to set or map name. knftables
// writes an element as "{ KEY [: VALUE] }"; the key given here is the list of all but the last
// value, so that the command reads "{ k1 : v1, k2 : v2, ..., kn : vn }".
func groupedElements(name string, s *set, keys []string, elems map[string]string) *knftables.Element {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
		if s.isMap && i < len(keys)-1 {
			b.WriteString(" : ")
			b.WriteString(elems[k])
		}
	}
	if s.isMap {
		return &knftables.Element{Map: name, Key: []string{b.String()}, Value: []string{elems[keys[len(keys)-1]]}}
	}
	return &knftables.Element{Set: name, Key: []string{b.String()}}
}

func addSetObject(tx *knftables.Transaction, name string, s *set) {
	var comment *string
	if s.comment != "" {
		comment = knftables.PtrTo(s.comment)
	}
	if s.isMap {
		tx.Add(&knftables.Map{Name: name, Type: s.typ, Comment: comment})
		return
	}
	st := &knftables.Set{Name: name, Type: s.typ, Comment: comment}
	if s.interval {
		st.Flags = []knftables.SetFlag{knftables.IntervalFlag}
	}
	if s.learned {
		st.Flags = []knftables.SetFlag{knftables.TimeoutFlag}
	}
	tx.Add(st)
}

func addChainObject(tx *knftables.Transaction, name string, c *chain) {
	ch := &knftables.Chain{Name: name}
	if c.base != nil {
		cp := *c.base
		ch = &cp
	}
	if c.comment != "" {
		ch.Comment = knftables.PtrTo(c.comment)
	}
	tx.Add(ch)
}

func element(setName string, s *set, key, value string) *knftables.Element {
	if s.isMap {
		return &knftables.Element{Map: setName, Key: []string{key}, Value: []string{value}}
	}
	return &knftables.Element{Set: setName, Key: []string{key}}
}

// plan is the difference between two table contents. Applied in field order it respects
// references: new objects come before anything points at them, and objects go only after
// the rules and map elements pointing at them are gone.
type plan struct {
	newSets, newChains []string
	rewrite            []string // chains whose rules are (re)written
	existed            map[string]bool
	elems              []elementChange
	goneChains         []string
	goneSets           []string
	// intervalChanged is set when an existing interval set gains or loses elements. Only
	// new interval sets are encoded for netlink (ipBlock sets are named by their content, so
	// an existing one never changes); a change to one goes through the CLI.
	intervalChanged bool
}

func (p *plan) empty() bool {
	return len(p.newSets)+len(p.newChains)+len(p.rewrite)+len(p.elems)+len(p.goneChains)+len(p.goneSets) == 0
}

// operations counts the commands the plan sends, the transaction size.
func (p *plan) operations(new *Rendered) int {
	n := len(p.newSets) + len(p.newChains) + len(p.elems) + 2*len(p.goneChains) + len(p.goneSets)
	for _, name := range p.rewrite {
		n += len(new.Chains[name].rules)
		if p.existed[name] {
			n++
		}
	}
	return n
}

// diff computes the plan that turns table content old into new. It walks the maps unsorted
// and sorts only what changed: a change touches a handful of the table's ~2,600 objects.
func diff(old, new *Rendered) *plan {
	p := &plan{existed: map[string]bool{}}
	var changedSets []string
	for name, s := range new.Sets {
		o, ok := old.Sets[name]
		if !ok {
			p.newSets = append(p.newSets, name)
		}
		if s != o { // the renderer returns the same pointer for unchanged content
			changedSets = append(changedSets, name)
		}
	}
	for name, c := range new.Chains {
		o, ok := old.Chains[name]
		if !ok {
			p.newChains = append(p.newChains, name)
		}
		if ok && (o == c || equalStrings(o.rules, c.rules)) {
			continue
		}
		p.rewrite = append(p.rewrite, name)
		p.existed[name] = ok
	}
	slices.Sort(p.newSets)
	slices.Sort(p.newChains)
	slices.Sort(p.rewrite)
	slices.Sort(changedSets)
	for _, name := range changedSets {
		s := new.Sets[name]
		n := len(p.elems)
		o := old.Sets[name]
		p.elems = diffElements(p.elems, name, s, o)
		p.intervalChanged = p.intervalChanged || (s.interval && o != nil && len(p.elems) > n)
	}
	for name := range old.Chains {
		if _, ok := new.Chains[name]; !ok {
			p.goneChains = append(p.goneChains, name)
		}
	}
	for name := range old.Sets {
		if _, ok := new.Sets[name]; !ok {
			p.goneSets = append(p.goneSets, name)
		}
	}
	slices.Sort(p.goneChains)
	slices.Sort(p.goneSets)
	return p
}

// writeTx adds the plan to an nft transaction.
func (p *plan) writeTx(tx *knftables.Transaction, old, new *Rendered, learnedOf func(string) []policy.LearnedElement) {
	for _, name := range p.newSets {
		addSetObject(tx, name, new.Sets[name])
		if new.Sets[name].learned {
			for _, e := range learnedTextElements(name, learnedOf(name)) {
				tx.Add(e)
			}
		}
	}
	for _, name := range p.newChains {
		addChainObject(tx, name, new.Chains[name])
	}
	for _, name := range p.rewrite {
		if p.existed[name] {
			tx.Flush(&knftables.Chain{Name: name})
		}
		for _, rule := range new.Chains[name].rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: rule})
		}
	}
	for _, e := range p.elems {
		addElementChange(tx, e)
	}
	// Every removed chain is flushed before any is deleted, so jumps between removed chains
	// are gone first; sets go last, once no rule uses them.
	for _, name := range p.goneChains {
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, name := range p.goneChains {
		tx.Delete(&knftables.Chain{Name: name})
	}
	for _, name := range p.goneSets {
		if old.Sets[name].isMap {
			tx.Delete(&knftables.Map{Name: name})
		} else {
			tx.Delete(&knftables.Set{Name: name})
		}
	}
}

// netlinkable reports whether the whole plan can go over netlink: no change to an existing
// interval set, new interval sets only of ranges netlink can write as nft does, no new maps,
// and rewritten chains only of the kinds that exist in structured form.
func (p *plan) netlinkable(new *Rendered) bool {
	if p.intervalChanged {
		return false
	}
	for _, name := range p.newSets {
		s := new.Sets[name]
		if s.isMap {
			return false
		}
		if _, err := newIntervalElements(s); s.interval && err != nil {
			return false
		}
	}
	for _, name := range p.rewrite {
		if c := new.Chains[name]; c.base != nil || len(c.specs) != len(c.rules) {
			return false
		}
	}
	return true
}

func addElementChange(tx *knftables.Transaction, e elementChange) {
	s := &set{isMap: e.isMap}
	if e.delete {
		tx.Delete(element(e.set, s, e.key, ""))
	} else {
		tx.Add(element(e.set, s, e.key, e.value))
	}
}

func diffElements(out []elementChange, name string, s, old *set) []elementChange {
	var was *setdelta.Content[string]
	if old != nil {
		was = &old.Content
	}
	// Deletions before additions (a changed map value is both).
	add, del := s.Changes(was)
	for _, k := range del {
		out = append(out, elementChange{set: name, isMap: s.isMap, key: k, delete: true})
	}
	for _, k := range add {
		var value string
		if s.isMap { // a set's elements have no value; a map's are given in full, so no lookup renders any
			value = s.Elements()[k]
		}
		out = append(out, elementChange{set: name, isMap: s.isMap, key: k, value: value})
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Cleanup removes the table and forgets what was applied.
func (b *Backend) Cleanup(ctx context.Context) error {
	tx := b.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	b.applied = nil
	if err := command.Tracked("nft", func() error { return b.nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("removing table inet %s: %w", TableName, err)
	}
	return nil
}

// Drift describes how the kernel's table differs from what was applied.
type Drift struct{ Reason string }

func (d *Drift) Error() string { return "nftables table drifted: " + d.Reason }

// Verify compares the kernel's table with what was last applied. It returns a *Drift when the
// table is missing, has different chains, rule counts or elements, or was edited in place since
// the previous check without our doing. It lists the table once, statelessly.
func (b *Backend) Verify(ctx context.Context) error {
	if b.applied == nil {
		return &Drift{Reason: "no successful sync yet"}
	}
	out, err := exec.CommandContext(ctx, "nft", "-j", "-s", "list", "table", "inet", TableName).Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg = strings.TrimSpace(string(ee.Stderr))
		}
		return &Drift{Reason: "listing table: " + msg}
	}
	got, hash, err := parseListing(out, func(set string) bool {
		s := b.applied.Sets[set]
		return s != nil && s.learned
	})
	if err != nil {
		return fmt.Errorf("parsing nft listing: %w", err)
	}
	if reason := compareCounts(b.applied, got); reason != "" {
		return &Drift{Reason: reason}
	}
	if !b.syncedSince && b.verifiedHash != "" && hash != b.verifiedHash {
		return &Drift{Reason: "table edited in place"}
	}
	b.verifiedHash, b.syncedSince = hash, false
	return nil
}

// Dump renders r as an nft script, as `netwarden render` prints it.
func Dump(r *Rendered) string {
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	tx := fake.NewTransaction()
	WriteFull(tx, r)
	if err := fake.Run(context.Background(), tx); err != nil {
		return "# render error: " + err.Error() + "\n"
	}
	var buf bytes.Buffer
	for _, sk := range r.Skipped {
		fmt.Fprintf(&buf, "# skipped %s, fail-closed (its pods stay isolated, it admits nothing): %s\n", sk.Policy, sk.Reason)
	}
	buf.WriteString(fake.Dump())
	return buf.String()
}

// KernelTables implements dataplane.KernelTables.
func (b *Backend) KernelTables() []dataplane.KernelTable {
	return []dataplane.KernelTable{{Family: "inet", Name: TableName}}
}
