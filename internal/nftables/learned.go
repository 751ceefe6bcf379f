package nftables

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/policy"
)

var (
	_ policy.DomainLearning = (*Backend)(nil)
	_ policy.LearnedReader  = (*Backend)(nil)
)

// learnedSets is what the backend keeps for the DomainSets' elements, which the learner writes
// beside the syncs. mu orders the learner's writes with the syncs that create or remove
// DomainSets: a sync that creates one takes its elements from source under mu and updates
// inKernel before releasing it, so an element the learner records is either in that
// transaction or written by Admit after it, never lost between them.
type learnedSets struct {
	mu       sync.Mutex
	source   policy.LearnedSource
	inKernel map[string]bool // kernel set names (with the family suffix) of DomainSets
	conn     nftnl.Conn
}

// SetLearnedSource implements policy.DomainLearning.
func (b *Backend) SetLearnedSource(src policy.LearnedSource) {
	b.learned.mu.Lock()
	b.learned.source = src
	b.learned.mu.Unlock()
}

// Admit implements policy.DomainLearning: one netlink batch. An element added again gets the
// new timeout (and comment) in place.
func (b *Backend) Admit(elems []policy.LearnedElement) error {
	l := &b.learned
	l.mu.Lock()
	defer l.mu.Unlock()
	bySet := map[string][]policy.LearnedElement{}
	for _, e := range elems {
		name := e.Set + famSuffix(e.Addr.Is6())
		if l.inKernel[name] {
			bySet[name] = append(bySet[name], e)
		}
	}
	if len(bySet) == 0 {
		return nil
	}
	err := l.conn.Batch(func(conn *gnft.Conn) error {
		table := &gnft.Table{Name: TableName, Family: gnft.TableFamilyINet}
		for name, es := range bySet {
			s := learnedSetObject(table, name)
			if err := conn.SetAddElements(s, gnftLearned(es)); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
		return nil
	})
	if errors.Is(err, unix.ENOENT) {
		// Someone removed our table or a set (a repair will follow): nothing to add to.
		return fmt.Errorf("nftables: a domain set is not in the kernel: %w", err)
	}
	return err
}

// lockIfLearning takes the learner's lock when a sync from old to new creates or removes a
// DomainSet (or replaces the table, old nil), and returns what releases it once the sync is
// over, recording which DomainSets the kernel then holds.
func (b *Backend) lockIfLearning(old, new *Rendered) func(applied bool) {
	changes := old == nil
	if !changes {
		for name, s := range new.Sets {
			if s.learned && old.Sets[name] == nil {
				changes = true
				break
			}
		}
		for name, s := range old.Sets {
			if s.learned && new.Sets[name] == nil {
				changes = true
				break
			}
		}
	}
	if !changes {
		return func(bool) {}
	}
	l := &b.learned
	l.mu.Lock()
	return func(applied bool) {
		defer l.mu.Unlock()
		if !applied {
			// The kernel may hold either version: write only to the sets both hold.
			for name := range l.inKernel {
				if s := new.Sets[name]; s == nil || !s.learned {
					delete(l.inKernel, name)
				}
			}
			return
		}
		l.inKernel = map[string]bool{}
		for name, s := range new.Sets {
			if s.learned {
				l.inKernel[name] = true
			}
		}
	}
}

// learnedOf returns the elements the source has for the kernel set name (a DomainSet of one
// family). The caller holds the learner's lock.
func (b *Backend) learnedOf(name string) []policy.LearnedElement {
	if b.learned.source == nil {
		return nil
	}
	v6 := strings.HasSuffix(name, famSuffix(true))
	var out []policy.LearnedElement
	for _, e := range b.learned.source.Learned(strings.TrimSuffix(strings.TrimSuffix(name, famSuffix(false)), famSuffix(true))) {
		if e.Addr.Is6() == v6 && e.Timeout > 0 {
			out = append(out, e)
		}
	}
	return out
}

func learnedSetObject(table *gnft.Table, name string) *gnft.Set {
	kt := gnft.TypeIPAddr
	if strings.HasSuffix(name, famSuffix(true)) {
		kt = gnft.TypeIP6Addr
	}
	return &gnft.Set{Table: table, Name: name, KeyType: kt, HasTimeout: true}
}

func gnftLearned(es []policy.LearnedElement) []gnft.SetElement {
	out := make([]gnft.SetElement, len(es))
	for i, e := range es {
		out[i] = gnft.SetElement{Key: e.Addr.AsSlice(), Timeout: roundTimeout(e.Timeout), Comment: e.Comment}
	}
	return out
}

// roundTimeout keeps a timeout in whole milliseconds, the kernel's unit, and at least one.
func roundTimeout(d time.Duration) time.Duration {
	return max(d.Round(time.Millisecond), time.Millisecond)
}

// learnedTextElements are the elements for an nft transaction, timeout and comment written
// after the key as nft reads them. knftables has no field for an element's timeout: it goes
// in the key, which knftables writes as it is ("{ ADDR timeout Nms comment ... }").
func learnedTextElements(name string, es []policy.LearnedElement) []*knftables.Element {
	out := make([]*knftables.Element, len(es))
	for i, e := range es {
		key := fmt.Sprintf("%s timeout %dms", e.Addr, roundTimeout(e.Timeout).Milliseconds())
		var comment *string
		if e.Comment != "" {
			comment = knftables.PtrTo(e.Comment)
		}
		out[i] = &knftables.Element{Set: name, Key: []string{key}, Comment: comment}
	}
	return out
}

// writeLearned adds to tx the elements the learner has for r's DomainSets, which must be new
// in tx.
func writeLearned(tx *knftables.Transaction, r *Rendered, learnedOf func(string) []policy.LearnedElement) {
	for _, name := range slices.Sorted(maps.Keys(r.Sets)) {
		if r.Sets[name].learned {
			for _, e := range learnedTextElements(name, learnedOf(name)) {
				tx.Add(e)
			}
		}
	}
}

// ReadLearned implements policy.LearnedReader: the elements the kernel's DomainSets hold, with
// the time each has left, so that a restarted agent's first sync (which replaces the table)
// keeps what the one before it learned.
func (b *Backend) ReadLearned() ([]policy.LearnedElement, error) {
	c, err := b.learned.conn.Get()
	if err != nil {
		return nil, err
	}
	table := &gnft.Table{Name: TableName, Family: gnft.TableFamilyINet}
	sets, err := c.GetSets(table)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil // no table: nothing learned
		}
		return nil, err
	}
	var out []policy.LearnedElement
	for _, s := range sets {
		v6 := strings.HasSuffix(s.Name, famSuffix(true))
		if !strings.HasPrefix(s.Name, "dom-") || !s.HasTimeout || (!v6 && !strings.HasSuffix(s.Name, famSuffix(false))) {
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		set := strings.TrimSuffix(strings.TrimSuffix(s.Name, famSuffix(false)), famSuffix(true))
		for _, e := range elems {
			addr, ok := netip.AddrFromSlice(e.Key)
			if !ok || e.Expires <= 0 {
				continue
			}
			out = append(out, policy.LearnedElement{Set: set, Addr: addr.Unmap(), Timeout: e.Expires, Comment: e.Comment})
		}
	}
	return out, nil
}
