package policy_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// TestStagedJudgementAgreesWithAsWritten: for random clusters with random policies staged,
// the flattened judges say for every connection what the Ruleset compiled as written says, the
// pods they leave out are judged alike enforced and as written, and every difference is blamed
// on staged policies only.
func TestStagedJudgementAgreesWithAsWritten(t *testing.T) {
	spec := synth.Spec{Namespaces: 8, Pods: 60, LocalPods: 12, Policies: 40, ClusterPolicies: 16, LocalNode: "node-0", Nodes: 3, DualStack: true,
		LocalCIDRv4: synth.Default().LocalCIDRv4, RemoteCIDRv4: synth.Default().RemoteCIDRv4}
	base := synth.Generate(spec)
	var peers, locals []netip.Addr
	for _, p := range base.Pods.All() {
		for _, a := range p.IPs {
			peers = append(peers, a)
			if p.NodeName == spec.LocalNode {
				locals = append(locals, a)
			}
		}
	}
	peers = append(peers, netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::7"))
	ports := []uint16{53, 80, 443, 5432, 9000, 9001, 9002, 9042}
	differences := 0
	for seed := range 12 {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		st := base.Clone()
		var staged []string
		for k, np := range st.Policies {
			if r.IntN(4) == 0 {
				np = np.DeepCopy()
				np.Annotations = map[string]string{policy.StagedAnnotation: "true"}
				st.Policies[k] = np
				staged = append(staged, k)
			}
		}
		for k, cnp := range st.ClusterPolicies {
			if r.IntN(3) == 0 {
				cnp = cnp.DeepCopy()
				cnp.Annotations = map[string]string{policy.StagedAnnotation: "true"}
				st.ClusterPolicies[k] = cnp
				staged = append(staged, k)
			}
		}
		rs, stats := policy.Compile(st, spec.LocalNode)
		written, _ := policy.CompileAsWritten(st, spec.LocalNode)
		if stats.Staged == 0 || rs.Staged == nil {
			t.Fatalf("seed %d: %d staged, judgement %v", seed, stats.Staged, rs.Staged)
		}
		for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			for _, local := range locals {
				judge := rs.Staged.Judges[rs.Staged.Dispatch[dir][local]]
				for _, peer := range peers {
					if peer.Is4() != local.Is4() {
						continue
					}
					for _, proto := range []policy.Protocol{policy.TCP, policy.UDP} {
						for _, port := range ports {
							e := rs.Judge(dir, local, peer, proto, port).Allowed
							w := written.Judge(dir, local, peer, proto, port).Allowed
							where := fmt.Sprintf("seed %d %s %s peer %s %s/%d", seed, dir, local, peer, proto, port)
							if judge == nil {
								if e != w {
									t.Fatalf("%s: not dispatched, yet enforced %v and as written %v", where, e, w)
								}
								continue
							}
							step := rs.JudgeStaged(judge, local, peer, proto, port)
							if step.Allow != w {
								t.Fatalf("%s: the judge says %v, as written %v", where, step.Allow, w)
							}
							if e == w {
								continue
							}
							differences++
							c, ok := rs.Staged.Causes[step.Cause]
							if !ok || len(c.Policies) == 0 || c.Direction != dir {
								t.Fatalf("%s: a difference with cause %q (%+v)", where, step.Cause, c)
							}
							for _, p := range c.Policies {
								if !slices.Contains(staged, p) {
									t.Fatalf("%s: the difference is blamed on %s, not staged (staged: %s)", where, p, strings.Join(staged, " "))
								}
							}
						}
					}
				}
			}
		}
	}
	if differences == 0 {
		t.Fatal("no connection judged differently: the test proves nothing")
	}
	t.Logf("%d differences checked", differences)
}

// TestNoStagedNoJudgement: a snapshot without staged policies has no staged judgement, and an
// incremental compile drops it once the last staged policy is enforced.
func TestNoStagedNoJudgement(t *testing.T) {
	spec := synth.Spec{Namespaces: 4, Pods: 20, LocalPods: 4, Policies: 8, LocalNode: "node-0", Nodes: 2,
		LocalCIDRv4: synth.Default().LocalCIDRv4, RemoteCIDRv4: synth.Default().RemoteCIDRv4}
	st := synth.Generate(spec)
	cc := policy.NewCompiler(spec.LocalNode)
	if rs, _ := cc.Compile(st); rs.Staged != nil {
		t.Fatal("a judgement without staged policies")
	}
	staged := st.Clone()
	for k, np := range staged.Policies {
		np = np.DeepCopy()
		np.Annotations = map[string]string{cluster.StagedAnnotation: "true"}
		staged.Policies[k] = np
	}
	if rs, _ := cc.Compile(staged); rs.Staged == nil || len(rs.Staged.Judges) == 0 {
		t.Fatal("every policy staged, yet no judge")
	}
	if rs, _ := cc.Compile(st); rs.Staged != nil {
		t.Fatal("the judgement stays after the annotations are gone")
	}
}
