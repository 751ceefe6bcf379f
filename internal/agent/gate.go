package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/gateproto"
	"github.com/netwarden/netwarden/internal/policy"
)

// maxGateWait bounds an ADD whose plugin never hangs up.
const maxGateWait = 5 * time.Minute

// gateState is what the agent knows from the netwarden-gate plugin: pods this node started
// whose addresses the state source may not report yet. The agent compiles them with those
// addresses (an overlay on the source's snapshot), so it never waits for Pod.Status.PodIPs.
type gateState struct {
	mu   sync.Mutex
	regs map[string]*registration // by pod key
	seq  uint64                   // counts registration changes
	// waiting are the ADDs not answered yet.
	waiting map[*waiter]struct{}
	// known holds the local pod addresses the guard lets through (their verdicts are in the
	// kernel), and installedSeq the registrations the rules were compiled from.
	known        map[netip.Addr]bool
	isolated     map[netip.Addr]bool
	installedSeq uint64

	// The rest belongs to the sync loop. The compiler gets a numbering of its own, so that a
	// registration changes the state it compiles even when the source's did not move.
	gen, srcGen uint64
	overlaid    map[string]overlayPod
	pendingSeq  uint64 // registrations of the state being synced
	podCIDRs    []netip.Prefix
	warnedCIDRs bool
}

type registration struct {
	att gateproto.Attachment
	ips []netip.Addr
}

type overlayPod struct{ base, pod *cluster.Pod }

type waiter struct {
	seq  uint64
	ips  []netip.Addr
	done chan bool // receives whether the pod is isolated
}

func newGateState() *gateState {
	return &gateState{regs: map[string]*registration{}, waiting: map[*waiter]struct{}{}, known: map[netip.Addr]bool{}}
}

// overlay returns st with the registered pods' addresses, numbered for the compiler. Only the
// policy loop calls it, once per sync, and hands the result to the compiler.
func (g *gateState) overlay(st *cluster.State, node string) *cluster.State {
	g.mu.Lock()
	regs := maps.Clone(g.regs)
	g.pendingSeq = g.seq
	g.mu.Unlock()

	out := *st
	g.gen++
	out.Generation = g.gen
	cur := map[string]overlayPod{}
	for key, r := range regs {
		base := st.Pods.Get(key)
		if base == nil || base.HostNetwork || base.Phase == corev1.PodSucceeded || base.Phase == corev1.PodFailed ||
			(base.NodeName != "" && base.NodeName != node) {
			continue
		}
		// The plugin's addresses are the newest word on a pod of this node: the API's may
		// still be missing, or be those of a sandbox that was replaced.
		if base.NodeName == node && slices.Equal(policy.EligibleIPs(base), r.ips) {
			continue
		}
		if prev, ok := g.overlaid[key]; ok && prev.base == base && slices.Equal(policy.EligibleIPs(prev.pod), r.ips) {
			cur[key] = prev
			continue
		}
		p := *base
		p.NodeName = node // the plugin ran here, whether or not the binding reached us
		p.IPs = slices.Clone(r.ips)
		cur[key] = overlayPod{base: base, pod: &p}
	}
	if len(cur) > 0 {
		out.Pods = st.Pods.Clone()
		for k, o := range cur {
			out.Pods.Set(k, o.pod)
		}
	}
	// The compiler may use Changes when they are relative to the state it compiled last,
	// which is ours numbered g.gen-1: the source's changes since the snapshot that one
	// wrapped, plus every pod whose overlay came or went.
	var srcChanges *cluster.Changes
	switch {
	case g.srcGen != 0 && st.Generation == g.srcGen:
		srcChanges = &cluster.Changes{}
	case g.srcGen != 0 && st.Changes != nil && st.Changes.Since == g.srcGen:
		srcChanges = st.Changes
	}
	out.Changes = nil
	if srcChanges != nil && g.gen > 1 {
		ch := *srcChanges
		ch.Since = g.gen - 1
		ch.Pods = slices.Clone(ch.Pods)
		for k := range g.overlaid {
			ch.Pods = append(ch.Pods, k)
		}
		for k := range cur {
			if _, ok := g.overlaid[k]; !ok {
				ch.Pods = append(ch.Pods, k)
			}
		}
		out.Changes = &ch
	}
	g.srcGen, g.overlaid = st.Generation, cur
	return &out
}

// guardInputs returns the pod CIDRs of node and the addresses of its pods in st.
func (g *gateState) guardInputs(st *cluster.State, node string, log interface{ Warn(string, ...any) }) ([]netip.Prefix, []netip.Addr) {
	var cidrs []netip.Prefix
	if n := st.Nodes[node]; n != nil {
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				cidrs = append(cidrs, p.Masked())
			}
		}
	}
	if len(cidrs) == 0 && !g.warnedCIDRs {
		g.warnedCIDRs = true
		log.Warn("the gate is on but this node's Node object has no podCIDRs: traffic of pods the agent does not know is not dropped", "node", node)
	}
	var known []netip.Addr
	for _, p := range st.Pods.All() {
		if p.NodeName == node {
			known = append(known, policy.EligibleIPs(p)...)
		}
	}
	g.podCIDRs = cidrs
	return cidrs, known
}

// installed records that the kernel holds the rules compiled with the registrations of the
// last overlay and that the guard lets known through, and answers the ADDs that were waiting
// for that.
func (g *gateState) installed(update bool, known []netip.Addr, rs *policy.Ruleset) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if update {
		g.known = make(map[netip.Addr]bool, len(known))
		for _, a := range known {
			g.known[a] = true
		}
		g.isolated = map[netip.Addr]bool{}
		for _, a := range known {
			if judged(rs, policy.Ingress, a) || judged(rs, policy.Egress, a) {
				g.isolated[a] = true
			}
		}
	}
	g.installedSeq = g.pendingSeq
	for w := range g.waiting {
		if w.seq <= g.installedSeq && g.allKnown(w.ips) {
			iso := false
			for _, a := range w.ips {
				iso = iso || g.isolated[a]
			}
			w.done <- iso
			delete(g.waiting, w)
		}
	}
}

func (g *gateState) allKnown(ips []netip.Addr) bool {
	for _, a := range ips {
		if !g.known[a] {
			return false
		}
	}
	return true
}

// serveGate answers the netwarden-gate plugin on a unix socket until ctx is done.
func (a *Agent) serveGate(ctx context.Context) error {
	path := a.np.GateSocket
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("--gate-socket %s: %w", path, err)
	}
	// A socket file left by an earlier run would make Listen fail.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("--gate-socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("--gate-socket %s: %w", path, err)
	}
	// Only root (the runtime that runs the plugins) may register pods.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("--gate-socket %s: %w", path, err)
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			go a.handleGate(ctx, c)
		}
	}()
	return nil
}

func (a *Agent) handleGate(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	req, err := gateproto.ReadRequest(r)
	if err != nil {
		_ = gateproto.WriteResponse(c, gateproto.Response{Error: err.Error()})
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	resp := a.gateRequest(ctx, r, req)
	_ = gateproto.WriteResponse(c, resp)
}

func parseAddrs(ips []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("ips: %q is not an IP address", s)
		}
		out = append(out, a.Unmap())
	}
	slices.SortFunc(out, func(x, y netip.Addr) int {
		// EligibleIPs order: the order the pod reports; keep IPv4 first, as the API does.
		if x.Is4() != y.Is4() {
			if x.Is4() {
				return -1
			}
			return 1
		}
		return x.Compare(y)
	})
	return out, nil
}

func (a *Agent) gateRequest(ctx context.Context, r *bufio.Reader, req gateproto.Request) gateproto.Response {
	g := a.gate
	switch req.Verb {
	case gateproto.VerbStatus:
		if !a.Ready() {
			return gateproto.Response{Error: "first sync has not completed"}
		}
		return gateproto.Response{}
	case gateproto.VerbAdd, gateproto.VerbCheck:
		if req.Namespace == "" || req.Name == "" {
			return gateproto.Response{Error: "namespace and name are required"}
		}
		ips, err := parseAddrs(req.IPs)
		if err != nil || len(ips) == 0 {
			return gateproto.Response{Error: fmt.Sprintf("ips: want the pod's addresses, got %q", req.IPs)}
		}
		key := cluster.Key(req.Namespace, req.Name)
		if req.Verb == gateproto.VerbCheck {
			g.mu.Lock()
			defer g.mu.Unlock()
			if reg := g.regs[key]; reg != nil && reg.att != req.Attachment {
				return gateproto.Response{Error: "another attachment of this pod is registered"}
			}
			if !g.allKnown(ips) {
				return gateproto.Response{Error: "the pod's verdicts are not installed"}
			}
			return gateproto.Response{}
		}
		w := &waiter{ips: ips, done: make(chan bool, 1)}
		g.mu.Lock()
		g.seq++
		g.regs[key] = &registration{att: req.Attachment, ips: ips}
		w.seq = g.seq
		g.waiting[w] = struct{}{}
		g.mu.Unlock()
		a.notify()
		// The plugin hangs up when its timeout passes; stop waiting then.
		gone := make(chan struct{})
		go func() {
			_, _ = r.ReadByte()
			close(gone)
		}()
		timer := time.NewTimer(maxGateWait)
		defer timer.Stop()
		select {
		case iso := <-w.done:
			return gateproto.Response{Isolated: iso}
		case <-gone:
		case <-timer.C:
		case <-ctx.Done():
		}
		g.mu.Lock()
		delete(g.waiting, w)
		g.mu.Unlock()
		return gateproto.Response{Error: "gave up waiting for the pod's verdicts"}
	case gateproto.VerbDel, gateproto.VerbGC:
		valid := map[gateproto.Attachment]bool{}
		for _, v := range req.Valid {
			valid[v] = true
		}
		g.mu.Lock()
		changed := false
		for key, reg := range g.regs {
			if req.Verb == gateproto.VerbDel && reg.att == req.Attachment || req.Verb == gateproto.VerbGC && !valid[reg.att] {
				delete(g.regs, key)
				changed = true
			}
		}
		if changed {
			g.seq++
		}
		g.mu.Unlock()
		if changed {
			a.notify()
		}
		return gateproto.Response{}
	}
	return gateproto.Response{Error: fmt.Sprintf("verb %q: want ADD, DEL, CHECK, GC or STATUS", req.Verb)}
}
