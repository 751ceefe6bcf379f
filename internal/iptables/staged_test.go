package iptables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
)

var stagedMark = map[string]string{policy.StagedAnnotation: "true"}

// stagedState is compiledTiersState with staged policies: a NetworkPolicy that would isolate
// the pod a/other (now judged by the Baseline tier) for ingress admitting TCP 8000 from the
// namespace only, an Admin tier policy that would deny TCP 80 from the web pods and accept
// egress to 198.51.100.0/24 (which the enforced Admin policy "guard" denies), and a Baseline
// policy that would deny egress to 8.8.8.8.
func stagedState() *cluster.State {
	st := compiledTiersState(3, 10)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "staged-other", Annotations: stagedMark},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &intstr.IntOrString{IntVal: 8000}}},
			}},
		},
	}
	cluster.DefaultNetworkPolicy(np)
	st.Policies["a/staged-other"] = np
	all := &metav1.LabelSelector{}
	st.ClusterPolicies["staged-admin"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "staged-admin", Annotations: stagedMark},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 5,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: all},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{
				{Name: "no-80", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &npav1beta1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: 80}}}}},
			},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Name: "docs", Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"198.51.100.0/24"}}}},
			}}}
	st.ClusterPolicies["staged-baseline"] = &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "staged-baseline", Annotations: stagedMark},
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.BaselineTier, Priority: 0,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{PodSelector: *all}},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Name: "no-dns", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []npav1beta1.CIDR{"8.8.8.8/32"}}}},
			}}}
	return st
}

// stagedOutcome is one difference recorded: an outcome chain a packet went through.
type stagedOutcome struct{ outcome, cause string }

// walkStaged runs p through r (see evalChains) and returns the verdict and the staged
// differences it recorded.
func walkStaged(t *testing.T, r *Rendered, start string, p packet) (bool, []stagedOutcome) {
	t.Helper()
	var got []stagedOutcome
	allowed, _ := evalChainsTrace(t, r, start, p, func(chain string) {
		if o, c, ok := parseOutcomeChain(chain); ok {
			got = append(got, stagedOutcome{o, c})
		}
	})
	return allowed, got
}

// refStaged is what the staged judgement says the kernel must record for p: per direction
// judged (egress, then ingress unless egress dropped), the difference between the enforced
// verdict (the reference model) and the judge's (Ruleset.JudgeStaged).
func refStaged(rs *policy.Ruleset, p packet, toNode bool) []stagedOutcome {
	var out []stagedOutcome
	dirs := []policy.Direction{policy.Egress, policy.Ingress}
	if toNode {
		dirs = dirs[:1]
	}
	for _, dir := range dirs {
		local, peer := p.src, p.dst
		if dir == policy.Ingress {
			local, peer = p.dst, p.src
		}
		enforced := refDirection(rs, dir, p)
		if key, ok := rs.Staged.Dispatch[dir][local]; ok {
			step := rs.JudgeStaged(rs.Staged.Judges[key], local, peer, p.proto, p.dport)
			switch {
			case enforced && !step.Allow:
				out = append(out, stagedOutcome{policy.WouldDeny, step.Cause})
			case !enforced && step.Allow:
				out = append(out, stagedOutcome{policy.WouldAllow, step.Cause})
			}
		}
		if !enforced {
			break
		}
	}
	return out
}

// TestStagedJudgedAsModel: the rendered chains of a Ruleset with staged policies, run packet by
// packet, keep every verdict of the enforced policies and record exactly the differences the
// staged judgement finds, each under its cause.
func TestStagedJudgedAsModel(t *testing.T) {
	rs, stats := policy.Compile(stagedState(), "n1")
	if stats.Staged != 3 || rs.Staged == nil || len(rs.Staged.Judges) == 0 {
		t.Fatalf("%d staged policies, judgement %v: the test proves nothing", stats.Staged, rs.Staged)
	}
	r := Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	var addrs []netip.Addr
	for _, s := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.200", "192.0.2.2", "192.0.2.7", "198.51.100.1", "8.8.8.8",
		"fd00::1", "fd00::2", "fd00::200", "2001:db8::2", "2001:db8:1::1", "fd00:1::1"} {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	seen := map[string]int{}
	for _, src := range addrs {
		for _, dst := range addrs {
			if src == dst || src.Is6() != dst.Is6() {
				continue
			}
			for _, proto := range []policy.Protocol{policy.TCP, policy.UDP, policy.SCTP} {
				for _, port := range []uint16{80, 443, 5500, 8000, 8001} {
					p := packet{src: src, dst: dst, proto: proto, dport: port}
					for _, toNode := range []bool{false, true} {
						start := chainForward
						if toNode {
							start = chainInput
						}
						allowed, got := walkStaged(t, r, start, p)
						if want := refAllowed(rs, p, toNode); allowed != want {
							t.Fatalf("%s (to node %v): allowed=%v, want %v as enforced", p, toNode, allowed, want)
						}
						want := refStaged(rs, p, toNode)
						if !slices.Equal(got, want) {
							t.Fatalf("%s (to node %v): recorded %v, want %v", p, toNode, got, want)
						}
						for _, o := range got {
							c := rs.Staged.Causes[o.cause]
							seen[o.outcome+" "+strings.Join(c.Policies, ",")+" "+c.Rule]++
						}
					}
				}
			}
		}
	}
	for _, want := range []string{
		"would-deny a/staged-other isolation: no rule admits",
		"would-allow a/staged-other rule 0",
		"would-deny staged-admin rule no-80 (deny)",
		"would-allow staged-admin rule docs (accept)",
		"would-deny staged-baseline rule no-dns (deny)",
	} {
		if seen[want] == 0 {
			t.Errorf("no packet recorded %q; recorded: %v", want, seen)
		}
	}
}

// TestRenderStaged: the layout of the staged chains, and a Ruleset without staged policies
// renders as it did before they existed, also from a Renderer that last rendered some.
func TestRenderStaged(t *testing.T) {
	st := stateWithPods(3)
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "deny", Annotations: stagedMark},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	cluster.DefaultNetworkPolicy(deny)
	st.Policies["a/deny"] = deny
	rs, _ := policy.Compile(st, "n1")
	plain, _ := policy.Compile(stateWithPods(3), "n1")
	if rs.Staged == nil || plain.Staged != nil {
		t.Fatalf("staged judgement %v, without the staged policy %v", rs.Staged, plain.Staged)
	}
	var cause string
	for id, c := range rs.Staged.Causes {
		if slices.Equal(c.Policies, []string{"a/deny"}) && strings.HasPrefix(c.Rule, "isolation") {
			cause = id
		}
	}
	if cause == "" {
		t.Fatalf("no cause names a/deny: %v", rs.Staged.Causes)
	}

	rd := &Renderer{stagedLog: &policy.DropLog{Group: 7, Rate: 10, Burst: 5}}
	r := rd.Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	ingressGroup, egressGroup := groupChain(rs.Dispatch[policy.Ingress][netip.MustParseAddr("10.0.0.1")]), groupChain(rs.Dispatch[policy.Egress][netip.MustParseAddr("10.0.0.1")])
	key := rs.Staged.Dispatch[policy.Ingress][netip.MustParseAddr("10.0.0.1")]
	if key == "" || len(rs.Staged.Dispatch[policy.Egress]) != 0 {
		t.Fatalf("staged dispatch %v", rs.Staged.Dispatch)
	}
	for fam := range r.Chains {
		c := r.Chains[fam]
		wantFwd := []string{"-j " + chainEgress, "-m conntrack --ctstate NEW -j " + chainStagedAcceptEgress,
			"-j " + chainIngress, "-m conntrack --ctstate NEW -j " + chainStagedAcceptIngress}
		if got := c[chainForward]; !slices.Equal(got[len(got)-4:], wantFwd) {
			t.Errorf("fam %d: %s is %q", fam, chainForward, got)
		}
		if got := c[chainInput]; !slices.Equal(got[len(got)-2:], wantFwd[:2]) {
			t.Errorf("fam %d: %s is %q", fam, chainInput, got)
		}
		if got := c[ingressGroup]; got[len(got)-1] != "-g "+chainStagedDropIngress {
			t.Errorf("fam %d: ingress group %q does not end in the goto to the after-drop judgement", fam, got)
		}
		if got := c[egressGroup]; got[len(got)-1] != "-g "+chainStagedDropEgress {
			t.Errorf("fam %d: egress group %q does not end in the goto to the after-drop judgement", fam, got)
		}
		if got := c[chainStagedAcceptEgress]; len(got) != 0 {
			t.Errorf("fam %d: %s is %q, want empty (no pod is judged again for egress)", fam, chainStagedAcceptEgress, got)
		}
		if got := c[chainStagedDropEgress]; !slices.Equal(got, []string{notNewDrop, "-j DROP"}) {
			t.Errorf("fam %d: %s is %q", fam, chainStagedDropEgress, got)
		}
		// Three pods in one block of 16: the roots lead to one block chain, which leads each
		// pod to the judge.
		sa, sd := c[chainStagedAcceptIngress], c[chainStagedDropIngress]
		if len(sa) != 1 || len(sd) != 3 || sd[0] != notNewDrop || sd[2] != "-j DROP" {
			t.Fatalf("fam %d: %s %q, %s %q", fam, chainStagedAcceptIngress, sa, chainStagedDropIngress, sd)
		}
		ja, jd := judgeChain(key, 0, afterAccept), judgeChain(key, 0, afterDrop)
		for _, tc := range []struct {
			rule, chain string
			tail        []string
		}{{sa[0], ja, nil}, {sd[1], jd, []string{"-j DROP"}}} {
			block := c[strings.Fields(tc.rule)[3]]
			if len(block) != 3+len(tc.tail) || !strings.HasSuffix(block[0], " -g "+tc.chain) || !slices.Equal(block[3:], tc.tail) {
				t.Errorf("fam %d: block chain of %q is %q, want three pods to %s", fam, tc.rule, block, tc.chain)
			}
		}
		// The staged isolation admits nothing: after accept it would deny, after drop it
		// drops as enforced.
		deny, allow := outcomeChain(policy.WouldDeny, cause), outcomeChain(policy.WouldAllow, cause)
		// The judge holds the rules of a/web (allowing) too; what none of them matches is
		// denied by the staged isolation.
		if got := c[ja]; len(got) < 2 || got[len(got)-1] != "-g "+deny || !strings.HasSuffix(got[0], " -j RETURN") {
			t.Errorf("fam %d: judge %s is %q", fam, ja, got)
		}
		if got := c[jd]; len(got) < 2 || got[len(got)-1] != "-j DROP" || !strings.Contains(got[0], " -g "+wouldAllowPrefix) {
			t.Errorf("fam %d: judge %s is %q", fam, jd, got)
		}
		wantLog := `-m conntrack --ctstate NEW -m limit --limit 10/sec -j NFLOG --nflog-prefix "nw:sd-` + cause + `" --nflog-group 7`
		if got := c[deny]; !slices.Equal(got, []string{wantLog, "-j RETURN"}) {
			t.Errorf("fam %d: would-deny chain %s is %q", fam, deny, got)
		}
		if _, ok := c[allow]; ok {
			t.Errorf("fam %d: would-allow chain %s rendered, which nothing leads to", fam, allow)
		}
	}
	if o, c, ok := parseOutcomeChain(outcomeChain(policy.WouldDeny, cause)); !ok || o != policy.WouldDeny || c != cause {
		t.Errorf("parseOutcomeChain: %q %q %v", o, c, ok)
	}

	// Without staged policies, from the same Renderer (whose caches hold lines with the
	// staged drops) and from a fresh one: exactly what it was.
	fresh := Dump(Render(plain))
	if got := Dump(rd.Render(plain)); got != fresh {
		t.Errorf("rendered after a staged render:\n%s\nwant:\n%s", got, fresh)
	}
	if strings.Contains(fresh, "NETWARDEN-S") || strings.Contains(fresh, "conntrack --ctstate NEW") {
		t.Errorf("staged chains without staged policies:\n%s", fresh)
	}
	if got, want := Dump(rd.Render(rs)), Dump((&Renderer{stagedLog: rd.stagedLog}).Render(rs)); got != want {
		t.Errorf("staged again after a plain render:\n%s\nwant:\n%s", got, want)
	}
}

// TestRenderStagedTiersAndDropLog: with drop logging and tiers, every drop of the enforcement
// goes to the after-drop judgement of its direction, the Deny rules' log chains included, and
// nothing drops outright but the after-drop chains.
func TestRenderStagedTiersAndDropLog(t *testing.T) {
	rs, _ := policy.Compile(stagedState(), "n1")
	logDir := map[string]policy.Direction{}
	for p, cp := range rs.ClusterPolicies {
		for _, rule := range cp.Rules {
			if rule.Action == policy.Deny {
				logDir[dropChain(policy.ClusterRuleDropID(p, rule.Index))] = cp.Direction
			}
		}
	}
	for _, log := range []*policy.DropLog{nil, {Group: 3, Rate: 5, Burst: 5}} {
		rd := &Renderer{log: log}
		r := rd.Render(rs)
		if r.Err() != nil {
			t.Fatal(r.Err())
		}
		gotos := 0
		for fam := range r.Chains {
			for name, rules := range r.Chains[fam] {
				staged := strings.HasPrefix(name, chainStagedDropEgress[:len(ChainPrefix)+3]) || strings.HasPrefix(name, judgeDropPrefix) ||
					strings.HasPrefix(name, wouldAllowPrefix) || strings.HasPrefix(name, ChainPrefix+"SDE") || strings.HasPrefix(name, ChainPrefix+"SDI")
				for _, rule := range rules {
					if strings.HasSuffix(rule, "-j DROP") && !staged {
						t.Errorf("log %v: %s drops outright: %q", log != nil, name, rule)
					}
					if strings.HasSuffix(rule, "-g "+chainStagedDropEgress) || strings.HasSuffix(rule, "-g "+chainStagedDropIngress) {
						gotos++
						dir := policy.Ingress
						if strings.HasSuffix(rule, "EGRESS") {
							dir = policy.Egress
						}
						if d, ok := logDir[name]; strings.HasPrefix(name, ChainPrefix+"L-") && (!ok || d != dir) {
							t.Errorf("log chain %s of a %q Deny goes to the %s judgement", name, d, dir)
						}
					}
				}
			}
		}
		if gotos == 0 {
			t.Fatalf("log %v: no drop goes to the after-drop judgement", log != nil)
		}
		if log != nil {
			// The Deny rules' log chains are reached by -g: the goto is theirs.
			for fam := range r.Chains {
				for name, rules := range r.Chains[fam] {
					if strings.HasPrefix(name, ChainPrefix+"L-") && !strings.HasPrefix(rules[len(rules)-1], "-g "+ChainPrefix+"SD-") {
						t.Errorf("log chain %s ends in %q", name, rules[len(rules)-1])
					}
				}
			}
		}
	}
}

// TestLastRuleCounters: the counter of each chain's last rule, from iptables-save -c output.
func TestLastRuleCounters(t *testing.T) {
	saved := `# Generated by iptables-save
*mangle
:FORWARD ACCEPT [10:600]
:NETWARDEN-D-abc - [0:0]
:NETWARDEN-P-def - [0:0]
[9:540] -A FORWARD -j NETWARDEN-FORWARD
[3:180] -A NETWARDEN-D-abc -m conntrack --ctstate NEW -m limit --limit 10/sec -j NFLOG --nflog-prefix "nw:sd-abc" --nflog-group 7
[4:240] -A NETWARDEN-D-abc -j RETURN
[0:0] -A NETWARDEN-P-def -j DROP
COMMIT
`
	got, err := lastRuleCounters([]byte(saved))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"NETWARDEN-D-abc": 4, "NETWARDEN-P-def": 0}
	if len(got) != len(want) || got["NETWARDEN-D-abc"] != 4 || got["NETWARDEN-P-def"] != 0 {
		t.Fatalf("got %v, want %v", got, want)
	}
}
