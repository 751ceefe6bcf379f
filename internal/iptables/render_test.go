package iptables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
)

// walk follows a packet from ip through the dispatch chains the way the kernel would: the
// first rule whose address matches decides where it goes. It returns the group chain reached,
// or "" when the address falls through (not isolated), and how many rules it crossed.
func walk(t *testing.T, chains map[string][]string, root string, ip netip.Addr) (string, int) {
	t.Helper()
	chain, crossed := root, 0
	for depth := 0; depth < 40; depth++ {
		next := ""
		for _, rule := range chains[chain] {
			crossed++
			f := strings.Fields(rule) // -s|-d PREFIX -g CHAIN
			if len(f) != 4 || f[2] != "-g" {
				t.Fatalf("%s: unexpected dispatch rule %q", chain, rule)
			}
			if netip.MustParsePrefix(f[1]).Contains(ip) {
				next = f[3]
				break
			}
		}
		if next == "" {
			return "", crossed
		}
		if strings.HasPrefix(next, groupPrefix) {
			return next, crossed
		}
		chain = next
	}
	t.Fatalf("dispatch of %s does not end", ip)
	return "", 0
}

func TestDispatchTree(t *testing.T) {
	rs := policy.NewRuleset()
	want := map[netip.Addr]string{}
	add := func(ip netip.Addr, i int) {
		grp := fmt.Sprintf("grp-ingress-%d", i%7)
		rs.Dispatch[policy.Ingress][ip] = grp
		rs.Groups[grp] = policy.Group{Direction: policy.Ingress}
		want[ip] = groupChain(grp)
	}
	i := 0
	for b := 0; b < 250; b++ { // a node's /24, nearly full
		add(netip.AddrFrom4([4]byte{10, 244, 3, byte(b)}), i)
		i++
	}
	for _, s := range []string{"10.0.0.1", "192.0.2.9", "10.244.4.1", "fd00::1", "fd00::2", "fd00:1::5", "2001:db8::1"} {
		add(netip.MustParseAddr(s), i)
		i++
	}
	for b := 0; b < 40; b++ {
		add(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 15: byte(b)}), i)
		i++
	}
	r := Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	maxCrossed := 0
	for ip, grp := range want {
		fam := v4
		if ip.Is6() {
			fam = v6
		}
		got, crossed := walk(t, r.Chains[fam], chainIngress, ip)
		if got != grp {
			t.Errorf("%s dispatched to %q, want %s", ip, got, grp)
		}
		maxCrossed = max(maxCrossed, crossed)
	}
	for _, miss := range []string{"10.244.3.251", "10.244.5.1", "fd00::3", "8.8.8.8"} {
		ip := netip.MustParseAddr(miss)
		fam := v4
		if ip.Is6() {
			fam = v6
		}
		if got, _ := walk(t, r.Chains[fam], chainIngress, ip); got != "" {
			t.Errorf("%s is not isolated but dispatched to %s", ip, got)
		}
	}
	for fam := range r.Chains {
		for name, rules := range r.Chains[fam] {
			if len(name) > maxChainName {
				t.Errorf("chain name %s too long", name)
			}
			if (strings.HasPrefix(name, ChainPrefix+"I4-") || strings.HasPrefix(name, ChainPrefix+"I6-")) && len(rules) > 16 {
				t.Errorf("block chain %s has %d rules", name, len(rules))
			}
		}
	}
	// 250 pods in a /24 and a few elsewhere: 16 blocks plus 3 lone pods, then 16 pods a block.
	if maxCrossed > 19+16 {
		t.Errorf("a packet crosses up to %d dispatch rules", maxCrossed)
	}

	// One more pod in an occupied block rewrites that block's chain, nothing else.
	add(netip.AddrFrom4([4]byte{10, 244, 3, 251}), 3)
	r2 := Render(rs)
	var changed []string
	for name, rules := range r2.Chains[v4] {
		if !slices.Equal(rules, r.Chains[v4][name]) {
			changed = append(changed, name)
		}
	}
	if len(changed) != 1 || !strings.HasPrefix(changed[0], ChainPrefix+"I4-") || len(r2.Chains[v4]) != len(r.Chains[v4]) {
		t.Errorf("one pod added changed chains %v (%d chains, were %d)", changed, len(r2.Chains[v4]), len(r.Chains[v4]))
	}
}

// TestNames: every kernel name fits its limit, is the same for the same Ruleset name, and
// names that differ only in what a cut would drop stay distinct.
func TestNames(t *testing.T) {
	long := strings.Repeat("n", 63) + "/" + strings.Repeat("p", 200)
	for _, n := range []string{groupChain("grp-ingress-" + long), dispatchChain("E6", netip.MustParsePrefix("fd00::/64"))} {
		if len(n) > maxChainName {
			t.Errorf("chain %s: %d > %d", n, len(n), maxChainName)
		}
	}
	for _, n := range []string{podSet(long, v6), cidrSet(long, v4), portSet("port-"+strings.Repeat("x", 15)+"-sctp", v6), swapSet} {
		if len(n) > maxSetName {
			t.Errorf("set %s: %d > %d", n, len(n), maxSetName)
		}
	}
	if podSet(long+"a", v4) == podSet(long+"b", v4) || podSet("x", v4) == podSet("x", v6) || podSet("x", v4) != podSet("x", v4) {
		t.Error("set names are not deterministic and distinct")
	}
}

// TestChainEdits applies the edit lines to the old rules, as iptables-restore would, and
// requires the new rules, for heads, tails, middles, growth, shrinking and emptying.
func TestChainEdits(t *testing.T) {
	cases := [][2][]string{
		{{"a", "b", "c"}, {"a", "x", "b", "c"}},
		{{"a", "b", "c"}, {"x", "a", "b", "c"}},
		{{"a", "b", "c"}, {"a", "b", "c", "x"}},
		{{"a", "b", "c"}, {"a", "c"}},
		{{"a", "b", "c"}, {"a", "x", "y", "z", "c"}},
		{{"a", "b", "c", "d"}, {"a", "x", "d"}},
		{{"a", "b"}, {}},
		{{}, {"a", "b"}},
		{{"a", "a", "a"}, {"a", "a"}},
		{{"p", "q"}, {"q", "p"}},
	}
	for _, c := range cases {
		edits := chainEdits("C", c[0], c[1])
		if got := applyEdits(t, "C", c[0], edits); !slices.Equal(got, c[1]) {
			t.Errorf("%q -> %q: edits %q give %q", c[0], c[1], edits, got)
		}
		if onlyInserts := len(c[1]) > len(c[0]); onlyInserts && strings.Contains(strings.Join(edits, "\n"), "-D") {
			t.Errorf("%q -> %q: growth must not delete: %q", c[0], c[1], edits)
		}
	}
}

// applyEdits applies the -I, -R and -D lines of one chain as iptables-restore does, failing
// on an edit that restore would refuse.
func applyEdits(t *testing.T, chain string, rules, edits []string) []string {
	t.Helper()
	out := slices.Clone(rules)
	for _, e := range edits {
		f := strings.SplitN(e, " ", 4)
		if len(f) < 3 || f[1] != chain {
			t.Fatalf("bad edit of chain %s: %q", chain, e)
		}
		pos, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("bad edit %q", e)
		}
		limit := len(out)
		if f[0] == "-I" {
			limit++
		}
		if pos < 1 || pos > limit {
			t.Fatalf("%s at %d of %d rules: %q", f[0], pos, len(out), e)
		}
		switch f[0] {
		case "-I":
			out = slices.Insert(out, pos-1, f[3])
		case "-R":
			out[pos-1] = f[3]
		case "-D":
			if len(f) != 3 {
				t.Fatalf("delete with a rule: %q", e)
			}
			out = slices.Delete(out, pos-1, pos)
		default:
			t.Fatalf("unknown edit %q", e)
		}
	}
	return out
}

// TestWholeFamilyIPBlock: hash:net refuses a /0, so an ipBlock of a whole family is its two
// halves, and one with excepts the prefixes left around them.
func TestWholeFamilyIPBlock(t *testing.T) {
	rs := policy.NewRuleset()
	for name, cidr := range map[string]string{"all4": "0.0.0.0/0", "all6": "::/0", "all4-but": "0.0.0.0/0", "all6-but": "::/0"} {
		p := netip.MustParsePrefix(cidr)
		var except []netip.Prefix
		switch name {
		case "all4-but":
			except = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}
		case "all6-but":
			except = []netip.Prefix{netip.MustParsePrefix("8000::/1")}
		}
		rs.CIDRSets[name] = &policy.CIDRSet{IPv6: p.Addr().Is6(), Prefixes: policy.SubtractPrefixes(p, except)}
	}
	r := Render(rs)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	for name, want := range map[string]string{
		cidrSet("all4", v4): "0.0.0.0/1 128.0.0.0/1",
		cidrSet("all6", v6): "8000::/1 ::/1",
		// Only the lower half is left, and hash:net holds it as it is.
		cidrSet("all6-but", v6): "::/1",
	} {
		if got := strings.Join(slices.Sorted(maps.Keys(r.Sets[name].Elements())), " "); got != want {
			t.Errorf("%s = %s: %s, want %s", name, r.Sources[name], got, want)
		}
	}
	got := r.Sets[cidrSet("all4-but", v4)].Elements()
	for _, m := range []string{"10.0.0.0/8", "192.0.2.7", "0.0.0.0/0"} {
		if got[m] {
			t.Errorf("all4-but holds %s", m)
		}
	}
	for _, m := range []string{"0.0.0.0/5", "11.0.0.0/8", "128.0.0.0/2", "192.0.2.6", "192.0.2.8/29"} {
		if !got[m] {
			t.Errorf("all4-but lacks %s: %v", m, slices.Sorted(maps.Keys(got)))
		}
	}
}
