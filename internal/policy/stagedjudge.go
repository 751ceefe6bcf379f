package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// StagedJudgement is what a backend needs to judge each new connection a second time, as the
// Ruleset compiled as written would (the staged policies enforced), without acting on it: the
// kernel records where that verdict differs from the enforced one, and which staged policy the
// difference is due to.
//
// Only the pods whose judgement the staged policies change are dispatched: those for which a
// stage (admin tier, NetworkPolicy, baseline tier) has other policies as written than enforced.
// Every other pod's two verdicts are equal by construction and cost nothing more. A judge is the
// whole judgement of one direction as written, flattened into segments, so that a verdict of
// the second judgement carries the cause of its difference, known when the rules are compiled.
type StagedJudgement struct {
	// Dispatch leads each local pod address the staged policies concern, per direction, to
	// the judge (a key of Judges) of its connections in that direction.
	Dispatch map[Direction]map[netip.Addr]string
	Judges   map[string]*StagedJudge
	// Causes holds, by ID, what a difference the judges find is due to.
	Causes map[string]StagedCause
}

// StagedJudge is one direction's judgement as written for the pods dispatched to it. It
// starts in Segments[0]; a rule that matches, or the end of a segment, goes on in a later
// segment or ends in a verdict.
type StagedJudge struct {
	Direction Direction
	Segments  []StagedSegment
}

// StagedSegment is a list of rules, tried in order, and where a packet none matches goes.
type StagedSegment struct {
	Rules []StagedRule
	End   StagedStep
}

// StagedRule matches with the conventions of Rule (an empty Peers list is any peer, an empty
// Ports list any port).
type StagedRule struct {
	Peers []Peer
	Ports []PortMatch
	Then  StagedStep
}

// StagedStep goes on in Segments[Next] when Next > 0 (segment 0 is only ever entered), and
// otherwise ends the judgement with the verdict Allow. Should that verdict differ from the
// enforced one, Cause (a key of Causes) says which staged policy makes the difference.
type StagedStep struct {
	Next  int
	Allow bool
	Cause string
}

// StagedCause names what a difference is due to: a rule of a staged policy, the isolation of a
// pod by staged NetworkPolicies that admit nothing, or, where no single rule is to blame, the
// staged policies judging the pod.
type StagedCause struct {
	Direction Direction
	// Policies are the staged policies: NetworkPolicies as "namespace/name",
	// ClusterNetworkPolicies by name (which holds no "/").
	Policies []string
	// Rule describes the rule: "rule 2", a ClusterNetworkPolicy rule's name, or what else
	// decided.
	Rule string
}

// Staged verdicts are logged with the prefix StagedLogID gives, which the agent resolves
// through the Causes of the Ruleset the kernel holds, as it does drop IDs.
const (
	WouldDeny  = "would-deny"  // allowed now, denied once the staged policies are enforced
	WouldAllow = "would-allow" // denied now, allowed once the staged policies are enforced
)

// StagedLogID is the log prefix of a staged verdict of outcome (WouldDeny or WouldAllow) due
// to cause. Cause IDs are 16 characters, which backends rely on: with iptables a chain named
// after one must fit 28.
func StagedLogID(outcome, cause string) string {
	if outcome == WouldDeny {
		return DropIDPrefix + "sd-" + cause
	}
	return DropIDPrefix + "sa-" + cause
}

// ParseStagedLogID reverses StagedLogID; ok is false for any other prefix.
func ParseStagedLogID(id string) (outcome, cause string, ok bool) {
	if c, found := strings.CutPrefix(id, DropIDPrefix+"sd-"); found {
		return WouldDeny, c, true
	}
	if c, found := strings.CutPrefix(id, DropIDPrefix+"sa-"); found {
		return WouldAllow, c, true
	}
	return "", "", false
}

// stagedJudgement builds the judgement of what written (the snapshot compiled with its staged
// policies) would change over enforced (the same snapshot without them). The staged policies
// are those written has and enforced lacks: every other policy compiles the same in both.
func stagedJudgement(enforced, written *Ruleset) *StagedJudgement {
	sj := &StagedJudgement{
		Dispatch: map[Direction]map[netip.Addr]string{Ingress: {}, Egress: {}},
		Judges:   map[string]*StagedJudge{},
		Causes:   map[string]StagedCause{},
	}
	isStaged := func(chain string) bool {
		if _, ok := written.Policies[chain]; ok {
			_, enf := enforced.Policies[chain]
			return !enf
		}
		_, enf := enforced.ClusterPolicies[chain]
		return !enf
	}
	for _, dir := range []Direction{Ingress, Egress} {
		local := map[netip.Addr]bool{}
		for _, d := range []map[netip.Addr]string{written.Admin.Dispatch[dir], written.Dispatch[dir], written.Baseline.Dispatch[dir]} {
			for a := range d {
				local[a] = true
			}
		}
		for a := range local {
			w, e := written.StageGroups(dir, a), enforced.StageGroups(dir, a)
			same := true
			for i := range w {
				same = same && slices.Equal(w[i].Policies, e[i].Policies)
			}
			if same {
				continue
			}
			stages := [3][]string{w[0].Policies, w[1].Policies, w[2].Policies}
			key := judgeName(dir, stages)
			if _, done := sj.Judges[key]; !done {
				b := judgeBuilder{rs: written, sj: sj, dir: dir, stages: stages, isStaged: isStaged, rest: map[string]int{}}
				sj.Judges[key] = b.build()
			}
			sj.Dispatch[dir][a] = key
		}
	}
	return sj
}

func judgeName(dir Direction, stages [3][]string) string {
	var b strings.Builder
	b.WriteString(string(dir))
	for _, s := range stages {
		b.WriteString("|" + strings.Join(s, "\n"))
	}
	return "sj-" + shortHash(b.String())
}

// judgeBuilder flattens one direction's judgement as written for pods whose stages hold the
// given policies. A difference is blamed on the first staged rule on the packet's path that
// matched (a staged Pass changes the path even when a rule of an enforced policy decides
// later), else on the staged NetworkPolicies isolating the pod when it ends isolated, else on
// all the staged policies judging the pod.
type judgeBuilder struct {
	rs       *Ruleset
	sj       *StagedJudgement
	dir      Direction
	stages   [3][]string // admin, NetworkPolicy, baseline: chain names in judging order
	isStaged func(chain string) bool
	j        StagedJudge
	rest     map[string]int // the segment after the admin tier, by the cause carried into it
}

func (b *judgeBuilder) build() *StagedJudge {
	b.j = StagedJudge{Direction: b.dir}
	if len(b.stages[0]) == 0 {
		b.after("")
	} else {
		b.j.Segments = append(b.j.Segments, StagedSegment{})
		var seg StagedSegment
		for _, chain := range b.stages[0] {
			cp := b.rs.ClusterPolicies[chain]
			if cp == nil {
				continue
			}
			for _, r := range cp.Rules {
				cause := b.ruleCause(chain, cp, r)
				then := StagedStep{Allow: r.Action == Accept, Cause: cause}
				if r.Action == Pass {
					then = StagedStep{Next: b.after(cause)}
				}
				seg.Rules = append(seg.Rules, StagedRule{Peers: r.Peers, Ports: r.Ports, Then: then})
			}
		}
		seg.End = StagedStep{Next: b.after("")}
		b.j.Segments[0] = seg
	}
	fallback := b.fallbackCause()
	for i := range b.j.Segments {
		s := &b.j.Segments[i]
		for k := range s.Rules {
			if s.Rules[k].Then.Next == 0 && s.Rules[k].Then.Cause == "" {
				s.Rules[k].Then.Cause = fallback
			}
		}
		if s.End.Next == 0 && s.End.Cause == "" {
			s.End.Cause = fallback
		}
	}
	j := b.j
	return &j
}

// after returns the segment that judges what the admin tier leaves: NetworkPolicy when it
// isolates the pod, else the baseline tier. cause is the difference already on the path.
func (b *judgeBuilder) after(cause string) int {
	if i, ok := b.rest[cause]; ok {
		return i
	}
	i := len(b.j.Segments)
	b.rest[cause] = i
	b.j.Segments = append(b.j.Segments, StagedSegment{})
	var seg StagedSegment
	first := func(c string) string {
		if cause != "" {
			return cause
		}
		return c
	}
	if nps := b.stages[1]; len(nps) > 0 {
		var staged []string
		for _, chain := range nps {
			pr := b.rs.Policies[chain]
			if pr == nil {
				continue
			}
			var own func(int) string
			if b.isStaged(chain) {
				staged = append(staged, pr.Source)
				own = func(k int) string {
					return b.cause(StagedCause{Direction: b.dir, Policies: []string{pr.Source}, Rule: "rule " + strconv.Itoa(k)})
				}
			}
			for k, r := range pr.Rules {
				c := ""
				if own != nil {
					c = own(k)
				}
				seg.Rules = append(seg.Rules, StagedRule{Peers: r.Peers, Ports: r.Ports, Then: StagedStep{Allow: true, Cause: first(c)}})
			}
		}
		end := ""
		if len(staged) > 0 {
			end = b.cause(StagedCause{Direction: b.dir, Policies: staged, Rule: "isolation: no rule admits"})
		}
		seg.End = StagedStep{Cause: first(end)}
	} else {
		for _, chain := range b.stages[2] {
			cp := b.rs.ClusterPolicies[chain]
			if cp == nil {
				continue
			}
			for _, r := range cp.Rules {
				seg.Rules = append(seg.Rules, StagedRule{Peers: r.Peers, Ports: r.Ports,
					Then: StagedStep{Allow: r.Action != Deny, Cause: first(b.ruleCause(chain, cp, r))}})
			}
		}
		seg.End = StagedStep{Allow: true, Cause: cause}
	}
	b.j.Segments[i] = seg
	return i
}

// ruleCause is the cause of a ClusterNetworkPolicy rule's verdict: the rule itself when its
// policy is staged, else none.
func (b *judgeBuilder) ruleCause(chain string, cp *ClusterPolicyRules, r ClusterRule) string {
	if !b.isStaged(chain) {
		return ""
	}
	name := r.Name
	if name == "" {
		name = "#" + strconv.Itoa(r.Index)
	}
	return b.cause(StagedCause{Direction: b.dir, Policies: []string{cp.Source}, Rule: "rule " + name + " (" + string(r.Action) + ")"})
}

// fallbackCause names every staged policy judging the pods.
func (b *judgeBuilder) fallbackCause() string {
	var staged []string
	for _, stage := range b.stages {
		for _, chain := range stage {
			if !b.isStaged(chain) {
				continue
			}
			if pr := b.rs.Policies[chain]; pr != nil {
				staged = append(staged, pr.Source)
			} else if cp := b.rs.ClusterPolicies[chain]; cp != nil {
				staged = append(staged, cp.Source)
			}
		}
	}
	return b.cause(StagedCause{Direction: b.dir, Policies: staged, Rule: "the staged policies judging the pod"})
}

// cause records c and returns its ID, a function of its content.
func (b *judgeBuilder) cause(c StagedCause) string {
	id := dropHash(string(c.Direction) + "|" + strings.Join(c.Policies, "\n") + "|" + c.Rule)
	b.sj.Causes[id] = c
	return id
}

// JudgeStaged walks judge j for a connection with the conventions of Ruleset.Judge, using the sets
// of rs: the verdict as written and the cause it carries.
func (rs *Ruleset) JudgeStaged(j *StagedJudge, local, peer netip.Addr, proto Protocol, port uint16) StagedStep {
	dst := local
	if j.Direction == Egress {
		dst = peer
	}
	seg := 0
	for range len(j.Segments) + 1 {
		step := j.Segments[seg].End
		for _, r := range j.Segments[seg].Rules {
			if rs.peerMatches(r.Peers, peer) && rs.portMatches(r.Ports, dst, proto, port) {
				step = r.Then
				break
			}
		}
		if step.Next == 0 {
			return step
		}
		seg = step.Next
	}
	panic("staged judge loops")
}

// withStaged returns enforced with the judgement of what written would change, and the sets
// the staged policies' rules name added. enforced itself is not modified.
func withStaged(enforced, written *Ruleset) *Ruleset {
	out := *enforced
	out.Staged = stagedJudgement(enforced, written)
	out.AddrSets = withMissing(out.AddrSets, written.AddrSets)
	out.CIDRSets = withMissing(out.CIDRSets, written.CIDRSets)
	out.NamedPortSets = withMissing(out.NamedPortSets, written.NamedPortSets)
	out.DomainSets = withMissing(out.DomainSets, written.DomainSets)
	return &out
}

// withMissing returns dst with the entries of src it lacks, in a copy when there are any:
// dst belongs to a published Ruleset.
func withMissing[V any](dst, src map[string]V) map[string]V {
	out, cloned := dst, false
	for k, v := range src {
		if _, ok := dst[k]; !ok {
			if !cloned {
				out, cloned = maps.Clone(dst), true
			}
			out[k] = v
		}
	}
	return out
}
