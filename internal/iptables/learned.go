package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/policy"
)

var _ policy.DomainLearning = (*Backend)(nil)

// learnedSets is what the backend keeps for the DomainSets' elements, which the learner writes
// beside the syncs (as the nftables backend does: see its learned.go). mu orders the learner's
// writes with the syncs that create or destroy DomainSets' ipsets.
type learnedSets struct {
	mu       sync.Mutex
	source   policy.LearnedSource
	inKernel map[string]string // ipset name → DomainSet name
	handle   *netlink.Handle
}

// SetLearnedSource implements policy.DomainLearning.
func (b *Backend) SetLearnedSource(src policy.LearnedSource) {
	b.learned.mu.Lock()
	b.learned.source = src
	b.learned.mu.Unlock()
}

// Admit implements policy.DomainLearning: each element over netlink, replacing the timeout
// (and comment) of one the set holds.
func (b *Backend) Admit(elems []policy.LearnedElement) error {
	l := &b.learned
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handle == nil {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("ipset netlink: %w", err)
		}
		l.handle = h
	}
	var errs []error
	for _, e := range elems {
		name := learnedSetName(e.Set, e.Addr.Is6())
		if _, ok := l.inKernel[name]; !ok {
			continue
		}
		t := uint32(roundTimeout(e.Timeout) / time.Second)
		err := l.handle.IpsetAdd(name, &netlink.IPSetEntry{IP: e.Addr.AsSlice(), Timeout: &t, Comment: e.Comment, Replace: true})
		if err != nil {
			errs = append(errs, fmt.Errorf("ipset %s: adding %s: %w", name, e.Addr, err))
		}
	}
	return errors.Join(errs...)
}

// roundTimeout is a timeout in whole seconds, ipset's unit, rounded up and at least one.
func roundTimeout(d time.Duration) time.Duration {
	return max((d+time.Second-1)/time.Second*time.Second, time.Second)
}

func learnedSetName(domainSet string, is6 bool) string {
	fam := v4
	if is6 {
		fam = v6
	}
	return domainSetName(domainSet, fam)
}

// learnedAdds writes the ipset restore lines adding what the source holds for the DomainSet
// ipset name. The caller holds the learner's lock.
func (b *Backend) learnedAdds(buf *bytes.Buffer, name string, s *ipset) {
	if b.learned.source == nil {
		return
	}
	for _, e := range b.learned.source.Learned(s.domainSet) {
		if e.Addr.Is6() != s.v6 || e.Timeout <= 0 {
			continue
		}
		fmt.Fprintf(buf, "add %s %s timeout %d", name, e.Addr, int(roundTimeout(e.Timeout)/time.Second))
		if e.Comment != "" {
			fmt.Fprintf(buf, " comment %q", strings.ReplaceAll(e.Comment, `"`, "'"))
		}
		buf.WriteString(" -exist\n")
	}
}

// lockIfLearning takes the learner's lock when a sync from old to new creates or destroys a
// DomainSet's ipset (or replaces everything, old nil), and returns what releases it once the
// sync is over, recording which the kernel then holds.
func (b *Backend) lockIfLearning(old, new *Rendered) func(applied bool) {
	changes := old == nil
	if !changes {
		for name, s := range new.Sets {
			if s.domainSet != "" && old.Sets[name] == nil {
				changes = true
				break
			}
		}
		for name, s := range old.Sets {
			if s.domainSet != "" && new.Sets[name] == nil {
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
			for name := range l.inKernel {
				if s := new.Sets[name]; s == nil || s.domainSet == "" {
					delete(l.inKernel, name)
				}
			}
			return
		}
		l.inKernel = map[string]string{}
		for name, s := range new.Sets {
			if s.domainSet != "" {
				l.inKernel[name] = s.domainSet
			}
		}
	}
}

// LearnedElement is what an ipset of a DomainSet holds for an address.
type LearnedElement struct {
	Held             bool
	Expires, Comment string
}

// Learned looks addr up in the ipset of the DomainSet set, for explain.
func Learned(ctx context.Context, set string, addr netip.Addr) (LearnedElement, error) {
	name := learnedSetName(set, addr.Is6())
	out, err := exec.CommandContext(ctx, "ipset", "list", name).CombinedOutput()
	if err != nil {
		return LearnedElement{}, fmt.Errorf("ipset %s: %s", name, strings.TrimSpace(string(out)))
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != addr.String() {
			continue
		}
		e := LearnedElement{Held: true}
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "timeout" {
				e.Expires = f[i+1] + "s"
			}
		}
		if _, c, ok := strings.Cut(line, `comment "`); ok {
			e.Comment = strings.TrimSuffix(c, `"`)
		}
		return e, nil
	}
	return LearnedElement{}, nil
}

var _ policy.LearnedReader = (*Backend)(nil)

// ReadLearned implements policy.LearnedReader: what the DomainSets' ipsets of the last sync hold,
// with the time left (nothing before the first sync, which keeps existing ipsets anyway).
func (b *Backend) ReadLearned() ([]policy.LearnedElement, error) {
	if b.applied == nil {
		return nil, nil
	}
	domainSets := map[string]*ipset{}
	for name, s := range b.applied.Sets {
		if s.domainSet != "" {
			domainSets[name] = s
		}
	}
	if len(domainSets) == 0 {
		return nil, nil
	}
	out, err := exec.Command("ipset", "save").Output()
	if err != nil {
		return nil, fmt.Errorf("ipset save: %w", err)
	}
	var elems []policy.LearnedElement
	for _, line := range strings.Split(string(out), "\n") {
		// add NAME ADDR timeout N [comment "..."]
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "add" || domainSets[f[1]] == nil || f[3] != "timeout" {
			continue
		}
		addr, err := netip.ParseAddr(f[2])
		secs, err2 := strconv.Atoi(f[4])
		if err != nil || err2 != nil || secs <= 0 {
			continue
		}
		e := policy.LearnedElement{Set: domainSets[f[1]].domainSet, Addr: addr, Timeout: time.Duration(secs) * time.Second}
		if _, c, ok := strings.Cut(line, ` comment "`); ok {
			e.Comment = strings.TrimSuffix(c, `"`)
		}
		elems = append(elems, e)
	}
	return elems, nil
}
