package iptables

// Staged policies (policy.StagedJudgement), rendered only when the Ruleset has some; without
// them not one rule differs. Each new connection is judged a second time, as it would be with
// the staged policies enforced, and where the two verdicts differ the kernel counts (and, with
// SetStagedLog, logs) the difference under its cause, without changing the verdict:
//
//	NETWARDEN-FORWARD/INPUT  after each direction's "-j <entry>" (which returns when that
//	                   direction allows): "-m conntrack --ctstate NEW -j NETWARDEN-SA-EGRESS"
//	                   (-INGRESS likewise)
//	NETWARDEN-SA-EGRESS  after accept: "-s <pod IP> -g NETWARDEN-JA-<hash>" for each pod the
//	                   staged policies concern (a two-level tree like NETWARDEN-EGRESS, blocks
//	                   NETWARDEN-SAE4/SAE6-<hash>); any other address falls off the end
//	NETWARDEN-SD-EGRESS  after drop: every DROP of the enforcement in that direction (a group's
//	                   final drop, an Admin or Baseline Deny, a drop-log chain's drop) is "-g
//	                   NETWARDEN-SD-EGRESS" instead, which drops what is not NEW, leads the
//	                   concerned pods to NETWARDEN-JD-<hash> (blocks NETWARDEN-SDE4/SDE6-<hash>)
//	                   and drops the rest
//	NETWARDEN-JA-<hash> one segment of a judge, after accept: its rules with the same matches as
//	                   policy rules, Next -g to the segment's chain, Allow -j RETURN (no
//	                   difference: back to the hook chain), deny -g NETWARDEN-D-<cause>
//	NETWARDEN-JD-<hash> the same after drop: deny -j DROP, Allow -g NETWARDEN-P-<cause>
//	NETWARDEN-D-<cause>  would-deny: [NFLOG "nw:sd-<cause>"], then -j RETURN (the connection
//	                   goes on; this rule's packet counter is the count)
//	NETWARDEN-P-<cause>  would-allow: [NFLOG "nw:sa-<cause>"], then -j DROP (counted likewise)
//
// The outcome chains hold the cause's ID itself, which ReadStagedCounters reads back. The
// judge chains' hash is of the judge's key and the segment's index, so a judge whose policies
// change is rewritten in place.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/netwarden/netwarden/internal/policy"
)

const (
	chainStagedAcceptEgress  = ChainPrefix + "SA-EGRESS"
	chainStagedAcceptIngress = ChainPrefix + "SA-INGRESS"
	chainStagedDropEgress    = ChainPrefix + "SD-EGRESS"
	chainStagedDropIngress   = ChainPrefix + "SD-INGRESS"
	judgeAcceptPrefix        = ChainPrefix + "JA-"
	judgeDropPrefix          = ChainPrefix + "JD-"
	wouldDenyPrefix          = ChainPrefix + "D-"
	wouldAllowPrefix         = ChainPrefix + "P-"

	// notNewDrop starts the after-drop roots: only new connections are judged again.
	notNewDrop = "-m conntrack ! --ctstate NEW -j DROP"
)

// stagedMode is which of the two paths a judge chain is on.
type stagedMode int

const (
	afterAccept stagedMode = iota // the enforcement allowed: a deny is a would-deny
	afterDrop                     // the enforcement dropped: an allow is a would-allow
)

func (m stagedMode) String() string {
	if m == afterAccept {
		return "after-accept"
	}
	return "after-drop"
}

// stagedRoot is the chain a direction's second judgement starts at on mode's path.
func stagedRoot(mode stagedMode, dir policy.Direction) string {
	switch {
	case mode == afterAccept && dir == policy.Egress:
		return chainStagedAcceptEgress
	case mode == afterAccept:
		return chainStagedAcceptIngress
	case dir == policy.Egress:
		return chainStagedDropEgress
	default:
		return chainStagedDropIngress
	}
}

// judgeChain names the chain of segment seg of judge key on mode's path.
func judgeChain(key string, seg int, mode stagedMode) string {
	prefix := judgeAcceptPrefix
	if mode == afterDrop {
		prefix = judgeDropPrefix
	}
	return prefix + hashOf(key + "/" + strconv.Itoa(seg))[:maxChainName-len(prefix)]
}

// outcomeChain names the chain that records outcome (policy.WouldDeny or WouldAllow) due to
// cause; parseOutcomeChain reverses it.
func outcomeChain(outcome, cause string) string {
	if outcome == policy.WouldDeny {
		return wouldDenyPrefix + cause
	}
	return wouldAllowPrefix + cause
}

func parseOutcomeChain(name string) (outcome, cause string, ok bool) {
	if c, found := strings.CutPrefix(name, wouldDenyPrefix); found && c != "" {
		return policy.WouldDeny, c, true
	}
	if c, found := strings.CutPrefix(name, wouldAllowPrefix); found && c != "" {
		return policy.WouldAllow, c, true
	}
	return "", "", false
}

// validCause reports whether a cause ID can be part of a chain name: it must fit, and be of
// the characters the IDs are made of.
func validCause(c string) bool {
	if c == "" || len(wouldDenyPrefix)+len(c) > maxChainName {
		return false
	}
	for _, ch := range c {
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
			return false
		}
	}
	return true
}

// dropTarget is the target of every drop of the enforcement in direction dir: the drop itself,
// or with staged policies the goto to the after-drop judgement.
func dropTarget(staged bool, dir policy.Direction) string {
	if staged {
		return "-g " + stagedRoot(afterDrop, dir)
	}
	return "-j DROP"
}

// stagedChains writes the chains of the second judgement (see the comment at the top).
func (rd *Renderer) stagedChains(r *Rendered, rs *policy.Ruleset) {
	sj := rs.Staged
	used := map[string][2]bool{} // judge key -> the families its pods are in
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		kind, flag := "I", "-d"
		if dir == policy.Egress {
			kind, flag = "E", "-s"
		}
		var acc, drop [2][]dispatchLeaf
		for ip, key := range sj.Dispatch[dir] {
			j := sj.Judges[key]
			if j == nil {
				r.fail(fmt.Errorf("staged dispatch of %s (%s) names judge %s, which does not exist", ip, dir, key))
				continue
			}
			if j.Direction != dir || len(j.Segments) == 0 {
				r.fail(fmt.Errorf("staged judge %s of direction %q with %d segments is dispatched for %s", key, j.Direction, len(j.Segments), dir))
				continue
			}
			fam := famOf(ip)
			acc[fam] = append(acc[fam], dispatchLeaf{ip: ip, chain: judgeChain(key, 0, afterAccept)})
			drop[fam] = append(drop[fam], dispatchLeaf{ip: ip, chain: judgeChain(key, 0, afterDrop)})
			markUsed(used, key, fam)
		}
		for fam := range r.Chains {
			sortLeaves(acc[fam])
			sortLeaves(drop[fam])
			r.dispatchTree(fam, stagedRoot(afterAccept, dir), "SA"+kind+famDigit(fam), flag, acc[fam], "")
			root := stagedRoot(afterDrop, dir)
			r.dispatchTree(fam, root, "SD"+kind+famDigit(fam), flag, drop[fam], "-j DROP")
			r.Chains[fam][root] = append([]string{notNewDrop}, r.Chains[fam][root]...)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(sj.Judges)) {
		fams, ok := used[key]
		if !ok {
			continue // no pod: no chain
		}
		j := sj.Judges[key]
		for _, mode := range []stagedMode{afterAccept, afterDrop} {
			for i, seg := range j.Segments {
				var out [2][]string
				add := func(step policy.StagedStep, peers []policy.Peer, ports []policy.PortMatch, always bool) {
					target, outcome := rd.stagedTarget(r, sj, key, j, mode, step)
					before := [2]int{len(out[v4]), len(out[v6])}
					if always {
						for fam := range out {
							out[fam] = append(out[fam], target)
						}
					} else {
						appendMatchLines(&out, j.Direction, peers, ports, target)
					}
					for fam := range out {
						if outcome != "" && fams[fam] && len(out[fam]) > before[fam] {
							rd.outcomeChain(r, fam, outcome, step.Cause)
						}
					}
				}
				for _, rule := range seg.Rules {
					add(rule.Then, rule.Peers, rule.Ports, false)
				}
				add(seg.End, nil, nil, true)
				chain := r.name(judgeChain(key, i, mode), fmt.Sprintf("staged judge %s segment %d %s", key, i, mode))
				for fam := range out {
					if fams[fam] {
						r.Chains[fam][chain] = out[fam]
					}
				}
			}
		}
	}
}

// stagedTarget is where step goes in judge key's chains on mode's path, and the outcome it
// records, if any.
func (rd *Renderer) stagedTarget(r *Rendered, sj *policy.StagedJudgement, key string, j *policy.StagedJudge, mode stagedMode, step policy.StagedStep) (target, outcome string) {
	if step.Next > 0 {
		if step.Next >= len(j.Segments) {
			r.fail(fmt.Errorf("staged judge %s goes on in segment %d of %d", key, step.Next, len(j.Segments)))
		}
		return "-g " + judgeChain(key, step.Next, mode), ""
	}
	// A verdict that is the enforced one's on this path is no difference; one without a
	// cause cannot be recorded (the model gives every verdict one).
	switch {
	case mode == afterAccept && (step.Allow || step.Cause == ""):
		return "-j RETURN", ""
	case mode == afterDrop && (!step.Allow || step.Cause == ""):
		return "-j DROP", ""
	}
	if !validCause(step.Cause) {
		r.fail(fmt.Errorf("staged judge %s: cause ID %q cannot name a chain", key, step.Cause))
	}
	if _, ok := sj.Causes[step.Cause]; !ok {
		r.fail(fmt.Errorf("staged judge %s names cause %s, which does not exist", key, step.Cause))
	}
	outcome = policy.WouldDeny
	if mode == afterDrop {
		outcome = policy.WouldAllow
	}
	return "-g " + outcomeChain(outcome, step.Cause), outcome
}

// outcomeChain writes, in family fam, the chain recording outcome due to cause.
func (rd *Renderer) outcomeChain(r *Rendered, fam int, outcome, cause string) {
	chain := r.name(outcomeChain(outcome, cause), outcome+" "+cause)
	if _, done := r.Chains[fam][chain]; done {
		return
	}
	var rules []string
	if rd.stagedLog != nil {
		rules = append(rules, logLine(rd.stagedLog, policy.StagedLogID(outcome, cause)))
	}
	final := "-j RETURN"
	if outcome == policy.WouldAllow {
		final = "-j DROP"
	}
	r.Chains[fam][chain] = append(rules, final)
}

// stagedRecord remembers when each outcome chain was last written, per family: a chain
// written anew (a full sync rewrites every chain) starts counting again at zero, so its
// counter is a new one (policy.StagedCounter.Rule). ReadStagedCounters reads it while a sync
// may update it.
type stagedRecord struct {
	mu     sync.Mutex
	serial uint64
	gen    [2]map[string]uint64
}

// begin starts the record of one sync's writes.
func (s *stagedRecord) begin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serial++
}

// written notes that the sync begun last wrote the named chains of family fam (only outcome
// chains are kept); a full sync passes every chain and clear, which forgets the others.
func (s *stagedRecord) written(fam int, names []string, clear bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if clear || s.gen[fam] == nil {
		s.gen[fam] = map[string]uint64{}
	}
	for _, n := range names {
		if _, _, ok := parseOutcomeChain(n); ok {
			s.gen[fam][n] = s.serial
		}
	}
}

func (s *stagedRecord) gone(fam int, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.gen[fam], n)
	}
}

func (s *stagedRecord) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen = [2]map[string]uint64{}
}

func (s *stagedRecord) lookup(fam int, name string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.gen[fam][name]
	return g, ok
}

// editedChains returns the chains that rule edits (-I, -R, -D lines) change.
func editedChains(edits []string) []string {
	var out []string
	for _, e := range edits {
		if f := strings.Fields(e); len(f) >= 2 {
			out = append(out, f[1])
		}
	}
	return out
}

// SetStagedLog implements policy.StagedReporter: with l, each staged difference is also sent
// to NFLOG with its policy.StagedLogID prefix; nil counts only. The next sync renders every
// chain anew.
func (b *Backend) SetStagedLog(l *policy.DropLog) {
	b.renderer = b.renderer.anew(func(r *Renderer) { r.stagedLog = l })
}

// ReadStagedCounters implements policy.StagedReporter: the packet counter of the last rule of
// every outcome chain this backend wrote, per family, as iptables-save -c lists it.
func (b *Backend) ReadStagedCounters(ctx context.Context) ([]policy.StagedCounter, error) {
	var out []policy.StagedCounter
	for fam, f := range families {
		cmd := b.run.Command(f, "-save")
		saved, err := exec.CommandContext(ctx, cmd, "-c", "-t", Table).Output()
		if err != nil {
			return nil, fmt.Errorf("%s -c -t %s: %w", cmd, Table, err)
		}
		last, err := lastRuleCounters(saved)
		if err != nil {
			return nil, fmt.Errorf("%s -c -t %s: %w", cmd, Table, err)
		}
		for _, chain := range slices.Sorted(maps.Keys(last)) {
			outcome, cause, ok := parseOutcomeChain(chain)
			if !ok {
				continue
			}
			gen, ok := b.staged.lookup(fam, chain)
			if !ok {
				continue // not written by this backend's syncs
			}
			out = append(out, policy.StagedCounter{Cause: cause, Outcome: outcome,
				Rule: fmt.Sprintf("%s %s #%d", f, chain, gen), Packets: last[chain]})
		}
	}
	return out, nil
}

// lastRuleCounters returns the packet counter of the last rule of each of our chains in
// iptables-save -c output ("[packets:bytes] -A CHAIN ...").
func lastRuleCounters(saved []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(saved))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "[") {
			continue
		}
		counts, rest, ok := strings.Cut(line[1:], "] ")
		if !ok || !strings.HasPrefix(rest, "-A ") {
			continue
		}
		chain, _, _ := strings.Cut(rest[3:], " ")
		if !isOurChain(chain) {
			continue
		}
		pkts, _, _ := strings.Cut(counts, ":")
		n, err := strconv.ParseUint(pkts, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("counter of %q: %w", line, err)
		}
		out[chain] = n
	}
	return out, sc.Err()
}
