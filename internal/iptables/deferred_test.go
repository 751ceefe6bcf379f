package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// dispatchRendering renders egress dispatch for pods (address -> group) the way Render does,
// with a group chain per group.
func dispatchRendering(pods map[netip.Addr]string) *Rendered {
	r := &Rendered{Sets: map[string]*ipset{}, Sources: map[string]string{}}
	for fam := range r.Chains {
		r.Chains[fam] = map[string][]string{chainEgress: nil}
	}
	var leaves [2][]dispatchLeaf
	for ip, g := range pods {
		fam := v4
		if ip.Is6() {
			fam = v6
		}
		leaves[fam] = append(leaves[fam], dispatchLeaf{ip: ip, chain: groupPrefix + g})
		r.Chains[fam][groupPrefix+g] = []string{"-j DROP"}
	}
	for fam := range leaves {
		slices.SortFunc(leaves[fam], func(a, b dispatchLeaf) int { return a.ip.Compare(b.ip) })
		r.dispatchTree(fam, chainEgress, "E"+famDigit(fam), "-s", leaves[fam], "")
	}
	return r
}

// judge follows dispatch for a packet from x as the kernel does: the first matching rule
// decides, -g continues in its chain for good, RETURN or falling off the end means the
// address is not isolated (""); otherwise the result is the group chain reached.
func judge(t *testing.T, chains map[string][]string, chain string, x netip.Addr) string {
	for _, rule := range chains[chain] {
		f := strings.Fields(rule)
		p, err := netip.ParsePrefix(f[1])
		if err != nil || len(f) != 4 {
			t.Fatalf("chain %s: unexpected rule %q", chain, rule)
		}
		if !p.Contains(x) {
			continue
		}
		switch {
		case f[2] == "-j" && f[3] == "RETURN":
			return ""
		case f[2] == "-g" && isDispatchChain(f[3]):
			return judge(t, chains, f[3], x)
		case f[2] == "-g":
			if _, ok := chains[f[3]]; !ok {
				t.Fatalf("rule %q goes to a chain that does not exist", rule)
			}
			return f[3]
		}
		t.Fatalf("chain %s: unexpected rule %q", chain, rule)
	}
	return ""
}

// TestDeferredRemovalsJudgeAsWanted checks, for random changes of which pods are isolated in
// which group (pods appearing, leaving, moving; blocks of addresses forming and dissolving),
// that the kernel state with deferred removals judges every address exactly as the wanted
// rendering does, that reaching it from the old state takes additions only, and that
// compacting it afterwards yields the wanted rendering.
func TestDeferredRemovalsJudgeAsWanted(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	addr := func(i int) netip.Addr {
		if i >= 48 {
			return netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(i - 48)})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
	}
	randomPods := func() map[netip.Addr]string {
		pods := map[netip.Addr]string{}
		for i := range 64 {
			if r.IntN(3) == 0 {
				pods[addr(i)] = fmt.Sprintf("g%d", r.IntN(4))
			}
		}
		return pods
	}
	deferred := 0
	for trial := range 400 {
		oldPods := randomPods()
		newPods := map[netip.Addr]string{}
		for ip, g := range oldPods {
			switch r.IntN(6) {
			case 0: // leaves
			case 1:
				newPods[ip] = fmt.Sprintf("g%d", r.IntN(4)) // may move
			default:
				newPods[ip] = g
			}
		}
		for range r.IntN(4) {
			newPods[addr(r.IntN(64))] = fmt.Sprintf("g%d", r.IntN(4))
		}
		kernel, want := dispatchRendering(oldPods), dispatchRendering(newPods)
		mid := withDeferredRemovals(kernel, want)
		for fam := range mid.Chains {
			for i := range 64 {
				x := addr(i)
				if got, w := judge(t, mid.Chains[fam], chainEgress, x), judge(t, want.Chains[fam], chainEgress, x); got != w {
					t.Fatalf("trial %d: %s is judged by %q with deferred removals, want %q\nold %v\nnew %v\nchains %v",
						trial, x, got, w, oldPods, newPods, mid.Chains[fam])
				}
			}
		}
		p := diff(kernel, mid)
		if p.removes() {
			t.Fatalf("trial %d: reaching the deferred state removes something: %+v", trial, p.chains)
		}
		for fam := range mid.Chains {
			for name, rules := range mid.Chains[fam] {
				old, ok := kernel.Chains[fam][name]
				if !ok {
					continue
				}
				if got := applyEdits(t, name, old, chainEdits(name, old, rules)); !slices.Equal(got, rules) {
					t.Fatalf("trial %d: edits of %s give %v, want %v", trial, name, got, rules)
				}
			}
		}
		if !reflect.DeepEqual(mid.Chains, want.Chains) {
			deferred++
		}
		c := diff(mid, want)
		for fam := range want.Chains {
			for name, rules := range want.Chains[fam] {
				old, ok := mid.Chains[fam][name]
				if ok && !slices.Equal(applyEdits(t, name, old, chainEdits(name, old, rules)), rules) {
					t.Fatalf("trial %d: compacting %s does not give the wanted rules", trial, name)
				}
			}
			for _, gone := range c.chains[fam].gone {
				if _, ok := want.Chains[fam][gone]; ok {
					t.Fatalf("trial %d: compaction removes wanted chain %s", trial, gone)
				}
			}
		}
	}
	if deferred < 100 {
		t.Fatalf("only %d of 400 changes had removals to defer; the test does not exercise them", deferred)
	}
}

// TestParseDispatchRule: only "-s|-d <prefix> -g <chain>" is a dispatch rule; shadowMerge
// reorders those alone, so a rule that continues after its match (-j) must not pass for one.
func TestParseDispatchRule(t *testing.T) {
	for rule, want := range map[string]bool{
		"-s 10.244.0.5/32 -g NETWARDEN-G-abc":   true,
		"-d fd00::/124 -g NETWARDEN-I6-abc":     true,
		"-s 10.244.0.5/32 -j NETWARDEN-G-abc":   false,
		"-s 10.244.0.5 -g NETWARDEN-G-abc":      false,
		"-p tcp -g NETWARDEN-G-abc":             false,
		"-s 10.244.0.5/32 -g NETWARDEN-G-abc x": false,
	} {
		if _, ok := parseDispatchRule(rule); ok != want {
			t.Errorf("parseDispatchRule(%q) = %v, want %v", rule, ok, want)
		}
	}
}
