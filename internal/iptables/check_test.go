package iptables

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
)

// TestExpectationsMatchRender holds the dispatch facts explain --kernel expects against the
// chains Render writes for random tiered rulesets, so that the check and the renderer cannot
// drift apart unnoticed: every fact holds on a faithful rendering, and taking away a pod's
// dispatch rule breaks the fact that names its group.
func TestExpectationsMatchRender(t *testing.T) {
	w := newRandomWorld()
	r := rand.New(rand.NewPCG(7, 11))
	checked, broken := 0, 0
	for round := 0; round < 30; round++ {
		rs := randomRuleset(r, w, false)
		rd := Render(rs)
		if rd.Err() != nil {
			t.Fatal(rd.Err())
		}
		var tables [2]*saved
		for fam := range tables {
			tables[fam] = &saved{rules: rd.Chains[fam]}
		}
		for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			for _, local := range w.pods {
				st := tables[famOf(local)]
				for _, e := range Expectations(rs, dir, local, local) {
					if e.isSet {
						continue
					}
					checked++
					if b := checkDispatch(st, e); b != "" {
						t.Fatalf("round %d: a faithful rendering fails a fact: %s", round, b)
					}
					if e.Want == "" {
						continue
					}
					// The same table without the pod's leaf rule.
					host := netip.PrefixFrom(local, local.BitLen()).String()
					cut := &saved{rules: map[string][]string{}}
					for name, rules := range st.rules {
						for _, rule := range rules {
							if !strings.Contains(rule, " "+host+" -g "+e.Want) {
								cut.rules[name] = append(cut.rules[name], rule)
							}
						}
					}
					if checkDispatch(cut, e) == "" {
						t.Fatalf("round %d: %s still holds without the rule for %s", round, e, host)
					}
					broken++
				}
			}
		}
	}
	if broken == 0 {
		t.Fatalf("no dispatched pod among %d facts: the rulesets test nothing", checked)
	}
	t.Logf("%d dispatch facts held, %d broken by removing their rule", checked, broken)
}
