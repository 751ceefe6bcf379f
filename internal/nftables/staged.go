package nftables

import (
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/policy"
)

// The judgement of staged policies (policy.StagedJudgement), only while some policy is staged:
//
//	staged-egress  (hook prerouting, priority filter + 1)  new connections the enforcing chain
//	staged-ingress (hook forward, priority filter + 1)     accepted: ip saddr|daddr vmap
//	                                                       @staged-out-a-v4 ... -> judge, after accept
//	staged-denied-out, -in   where every drop of the enforcing chains goes instead: for a new
//	                         connection, vmap @staged-out-d-v4 ... -> judge, after drop; then drop
//	sj-<hash>-<segment>-a4 / -d6 ...  a judge's segments (the judgement as written), per mode
//	                         and family; each rule goes on to a later segment or ends
//	staged-wd-<cause>        after accept, a verdict that would deny: log, count, accept
//	staged-wa-<cause>        after drop, a verdict that would allow: log, count, drop
//
// The enforcing chains decide first, and the second judgement sees only the verdict they
// reached: a packet they accept meets the staged base chain next on the same hook, where
// accept ends nothing but that chain; a packet they drop meets the staged-denied chain instead
// of the drop. So the judges record a difference at the verdicts that differ from the enforced
// one and never change a verdict. Only new connections of the pods the staged policies
// concern are judged twice: an established packet costs one more base chain and one rule.

const (
	chainStagedEgress  = "staged-egress"
	chainStagedIngress = "staged-ingress"
)

// stagedMode is which enforced verdict a judge's chains follow: 'a' after an accept (a
// would-deny is the difference), 'd' after a drop (a would-allow is).
type stagedMode byte

const (
	afterAccept stagedMode = 'a'
	afterDrop   stagedMode = 'd'
)

func dirWord(dir policy.Direction) string {
	if dir == policy.Egress {
		return "out"
	}
	return "in"
}

// stagedDenied names the chain the drops of direction dir go to while policies are staged.
func stagedDenied(dir policy.Direction) string { return "staged-denied-" + dirWord(dir) }

func stagedMap(dir policy.Direction, mode stagedMode, v6 bool) string {
	return "staged-" + dirWord(dir) + "-" + string(mode) + famSuffix(v6)
}

func judgeChain(judge string, segment int, mode stagedMode, v6 bool) string {
	fam := "4"
	if v6 {
		fam = "6"
	}
	return judge + "-" + strconv.Itoa(segment) + "-" + string(mode) + fam
}

// outcomeChain names the chain recording a difference due to cause: would-deny after an
// accept, would-allow after a drop.
func outcomeChain(mode stagedMode, cause string) string {
	if mode == afterAccept {
		return "staged-wd-" + cause
	}
	return "staged-wa-" + cause
}

// parseOutcomeChain reverses outcomeChain.
func parseOutcomeChain(chain string) (outcome, cause string, ok bool) {
	if c, found := strings.CutPrefix(chain, "staged-wd-"); found {
		return policy.WouldDeny, c, true
	}
	if c, found := strings.CutPrefix(chain, "staged-wa-"); found {
		return policy.WouldAllow, c, true
	}
	return "", "", false
}

// dropVerdict is how the enforcing chains of direction dir drop: a drop, or while policies
// are staged, a goto to the chain that judges the packet as written first.
func dropVerdict(staged bool, dir policy.Direction) ruleSpec {
	if staged {
		return ruleSpec{gotoTo: stagedDenied(dir)}
	}
	return ruleSpec{drop: true}
}

// renderStaged adds the chains and maps of rs.Staged to r.
func (rd *Renderer) renderStaged(rs *policy.Ruleset, r *Rendered) {
	sj := rs.Staged
	if sj == nil {
		return
	}
	fams := map[string][2]bool{}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			for _, mode := range []stagedMode{afterAccept, afterDrop} {
				elems := map[string]string{}
				for a, judge := range sj.Dispatch[dir] {
					if a.Is6() != v6 {
						continue
					}
					elems[a.String()] = "jump " + judgeChain(judge, 0, mode, v6)
					f := fams[judge]
					f[famIndex(v6)] = true
					fams[judge] = f
				}
				typ := "ipv4_addr : verdict"
				if v6 {
					typ = "ipv6_addr : verdict"
				}
				m := newSet(typ, "local pods staged policies concern, for "+string(dir)+" -> their judge", elems)
				m.isMap = true
				r.Sets[stagedMap(dir, mode, v6)] = m
			}
		}
		key := "daddr"
		name, hook := chainStagedIngress, knftables.ForwardHook
		if dir == policy.Egress {
			key, name, hook = "saddr", chainStagedEgress, knftables.PreroutingHook
		}
		base := &chain{rules: []string{
			"ct state != new accept",
			"ip " + key + " vmap @" + stagedMap(dir, afterAccept, false),
			"ip6 " + key + " vmap @" + stagedMap(dir, afterAccept, true),
		}}
		base.base = baseChain(name, hook, "filter+1")
		base.comment = "new connections the policies allowed, judged as the staged policies would"
		r.Chains[name] = base
		r.Chains[stagedDenied(dir)] = &chain{rules: []string{
			"ct state new ip " + key + " vmap @" + stagedMap(dir, afterDrop, false),
			"ct state new ip6 " + key + " vmap @" + stagedMap(dir, afterDrop, true),
			"drop",
		}}
	}
	causes := map[string][2]bool{} // by cause: referenced after accept, after drop
	for name, j := range sj.Judges {
		for fam, v6 := range []bool{false, true} {
			if !fams[name][fam] {
				continue
			}
			for _, mode := range []stagedMode{afterAccept, afterDrop} {
				step := func(s policy.StagedStep) ruleSpec {
					switch {
					case s.Next > 0:
						return ruleSpec{gotoTo: judgeChain(name, s.Next, mode, v6)}
					case mode == afterAccept && !s.Allow:
						noteCause(causes, s.Cause, 0)
						return ruleSpec{gotoTo: outcomeChain(mode, s.Cause)}
					case mode == afterDrop && s.Allow:
						noteCause(causes, s.Cause, 1)
						return ruleSpec{gotoTo: outcomeChain(mode, s.Cause)}
					}
					return ruleSpec{drop: !s.Allow}
				}
				for i, seg := range j.Segments {
					var specs []ruleSpec
					for _, rule := range seg.Rules {
						for _, sp := range expandRule(nil, j.Direction, rule.Peers, rule.Ports, step(rule.Then)) {
							if sp.v6 == v6 {
								specs = append(specs, sp)
							}
						}
					}
					end := step(seg.End)
					end.v6 = v6
					r.Chains[judgeChain(name, i, mode, v6)] = specChain(append(specs, end))
				}
			}
		}
	}
	for cause, modes := range causes {
		for i, mode := range []stagedMode{afterAccept, afterDrop} {
			if !modes[i] {
				continue
			}
			outcome := policy.WouldDeny
			final := ruleSpec{counter: true}
			if mode == afterDrop {
				outcome, final.drop = policy.WouldAllow, true
			}
			var specs []ruleSpec
			if rd.stagedLog != nil {
				specs = append(specs, logSpec(rd.stagedLog, policy.StagedLogID(outcome, cause)))
			}
			r.Chains[outcomeChain(mode, cause)] = specChain(append(specs, final))
		}
	}
}

func noteCause(causes map[string][2]bool, cause string, mode int) {
	c := causes[cause]
	c[mode] = true
	causes[cause] = c
}

func famIndex(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}
