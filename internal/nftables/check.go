package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/netwarden/netwarden/internal/kernel/nftjson"
	"github.com/netwarden/netwarden/internal/policy"
)

// Expectation is one fact of the kernel a verdict of the model depends on: whether a dispatch
// map sends a local pod's address to a group's chain, or whether a peer set holds an address.
type Expectation struct {
	Set string // the set or verdict map
	Key string // element key in nft syntax
	// Want is the verdict a map element must have ("jump grp-..."), "" when a map must not
	// hold the key; for a set, "member" or "".
	Want  string
	isMap bool
	// jumps, for a map element, lists in order the chains the wanted group's chain jumps to.
	// Group names depend on the agent's history of changes (see policy.groupNamer), what a
	// group does does not: an element that leads to another chain of the map's stage with the
	// same jumps holds the fact.
	jumps func() []string
	// kind is what the wanted group chain's name begins with and ends with (its stage,
	// direction and family): only a chain of that kind can stand for it.
	kind [2]string
}

func (e Expectation) String() string {
	switch {
	case e.isMap && e.Want != "":
		return fmt.Sprintf("map %s maps %s to %s", e.Set, e.Key, e.Want)
	case e.isMap:
		return fmt.Sprintf("map %s does not hold %s", e.Set, e.Key)
	case e.Want != "":
		return fmt.Sprintf("set %s holds %s", e.Set, e.Key)
	}
	return fmt.Sprintf("set %s does not hold %s", e.Set, e.Key)
}

// Expectations lists what the verdict of direction dir for local pod address local towards
// peer depends on in the kernel of local's node, rendered from rs: the local address in each
// stage's dispatch map (admin tier, NetworkPolicy, baseline tier), and the peer address in
// each pod set that a rule of the policies judging local names.
func Expectations(rs *policy.Ruleset, dir policy.Direction, local, peer netip.Addr) []Expectation {
	v6 := local.Is6()
	stages := rs.StageGroups(dir, local)
	rendered := sync.OnceValue(func() *Rendered { return Render(rs) })
	var out []Expectation
	for _, st := range stages {
		e := Expectation{Set: stageMap(st.Stage, dir, v6), Key: local.String(), isMap: true}
		if st.Group != "" {
			name := familyChain(st.Group, v6)
			e.Want = "jump " + name
			e.kind = [2]string{groupKind(st.Group), famSuffix(v6)}
			e.jumps = func() []string {
				if c := rendered().Chains[name]; c != nil {
					return append(chainJumps(c.rules), "") // never nil: a group may jump nowhere
				}
				return nil
			}
		}
		out = append(out, e)
	}
	for _, set := range rs.PeerSets(stages[:]...) {
		e := Expectation{Set: set + famSuffix(v6), Key: peer.String()}
		if rs.AddrSets[set].Holds(peer) {
			e.Want = "member"
		}
		out = append(out, e)
	}
	return out
}

// Programmed reports whether this network namespace's kernel holds the agent's table.
func Programmed(ctx context.Context) bool {
	return exec.CommandContext(ctx, "nft", "list", "table", "inet", TableName).Run() == nil
}

// Check looks each expectation up in the kernel's table (in the caller's network namespace)
// and returns a line for each that does not hold.
func Check(ctx context.Context, exps []Expectation) ([]string, error) {
	if out, err := exec.CommandContext(ctx, "nft", "list", "table", "inet", TableName).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("table inet %s is not in this node's kernel (is the agent running here, on the nftables backend?): %s", TableName, strings.TrimSpace(string(out)))
	}
	var bad []string
	for _, e := range exps {
		got, present, err := getElement(ctx, e.Set, e.Key)
		if err != nil {
			bad = append(bad, fmt.Sprintf("want: %s; kernel: %v", e, err))
			continue
		}
		switch {
		case e.Want == "" && present:
			bad = append(bad, fmt.Sprintf("want: %s; kernel: it holds it%s", e, suffix(got)))
		case e.Want != "" && !present:
			bad = append(bad, fmt.Sprintf("want: %s; kernel: it does not", e))
		case e.isMap && e.Want != "" && got != e.Want:
			if same, why := sameGroup(ctx, e, got); !same {
				bad = append(bad, fmt.Sprintf("want: %s; kernel: %s%s", e, got, why))
			}
		}
	}
	return bad, nil
}

// sameGroup reports whether the chain a map element leads to (verdict got) does what the
// wanted group's chain does: it jumps to the same policy chains in the same order. When it
// does not, why says how they differ.
func sameGroup(ctx context.Context, e Expectation, got string) (same bool, why string) {
	name, ok := strings.CutPrefix(got, "jump ")
	if !ok || e.jumps == nil {
		return false, ""
	}
	if !strings.HasPrefix(name, e.kind[0]) || !strings.HasSuffix(name, e.kind[1]) {
		return false, fmt.Sprintf(", which is no %s*%s chain", e.kind[0], e.kind[1])
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "chain", "inet", TableName, name).CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf(" (listing it: %s)", strings.TrimSpace(string(out)))
	}
	have, want := append(chainJumps(strings.Split(string(out), "\n")), ""), e.jumps()
	if want != nil && slices.Equal(have, want) {
		return true, ""
	}
	return false, fmt.Sprintf(", which jumps to [%s], not [%s]", strings.TrimSpace(strings.Join(have, " ")), strings.TrimSpace(strings.Join(want, " ")))
}

// groupKind is the part of a group's name that says its stage and direction
// ("grp-ingress-", "admin-grp-egress-"), before the hash that tells groups apart.
func groupKind(group string) string {
	i := strings.Index(group, "grp-")
	if i < 0 {
		return group
	}
	j := strings.IndexByte(group[i+len("grp-"):], '-')
	if j < 0 {
		return group
	}
	return group[:i+len("grp-")+j+1]
}

// chainJumps lists the chains that rules jump or go to, in order.
func chainJumps(rules []string) []string {
	var out []string
	for _, r := range rules {
		f := strings.Fields(r)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "jump" || f[i] == "goto" {
				out = append(out, strings.Trim(f[i+1], `"`))
			}
		}
	}
	return out
}

func suffix(v string) string {
	if v == "" {
		return ""
	}
	return " (" + v + ")"
}

// getElement asks nft for one element: present reports whether the set holds key, and value is
// a map element's verdict; a set that is not there at all is an error.
func getElement(ctx context.Context, set, key string) (value string, present bool, err error) {
	out, err := exec.CommandContext(ctx, "nft", "get", "element", "inet", TableName, set, "{", key, "}").CombinedOutput()
	text := string(out)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && strings.Contains(text, "Could not process rule: No such file or directory") {
			return "", false, nil // the set is there, the element is not
		}
		return "", false, fmt.Errorf("set %s: %s", set, strings.TrimSpace(strings.SplitN(text, "\n", 2)[0]))
	}
	// The answer lists the set with the element: "elements = { 10.0.0.1 : jump grp-... }".
	_, elems, ok := strings.Cut(text, "elements = {")
	if !ok {
		return "", false, nil
	}
	elems, _, _ = strings.Cut(elems, "}")
	if _, v, isMap := strings.Cut(elems, " : "); isMap {
		return strings.TrimSpace(v), true, nil
	}
	return "", true, nil
}

// counts is what a listing says about each chain (rules) and set (elements).
type counts struct {
	chains map[string]int
	sets   map[string]int
}

func compareCounts(want *Rendered, got counts) string {
	for name, c := range want.Chains {
		n, ok := got.chains[name]
		if !ok {
			return fmt.Sprintf("chain %s missing", name)
		}
		if n != len(c.rules) {
			return fmt.Sprintf("chain %s has %d rules, want %d", name, n, len(c.rules))
		}
	}
	for name, s := range want.Sets {
		n, ok := got.sets[name]
		if !ok {
			return fmt.Sprintf("set %s missing", name)
		}
		if n != s.Count() && !s.learned {
			return fmt.Sprintf("set %s has %d elements, want %d", name, n, s.Count())
		}
	}
	if len(got.chains) != len(want.Chains) {
		return fmt.Sprintf("table has %d chains, want %d", len(got.chains), len(want.Chains))
	}
	if len(got.sets) != len(want.Sets) {
		return fmt.Sprintf("table has %d sets and maps, want %d", len(got.sets), len(want.Sets))
	}
	return ""
}

// parseListing counts rules and elements in `nft -j list table` output, and digests it. The
// elements of the sets learned names are not ours to check: the learner adds them, and their
// listing changes every second (it shows the time left).
func parseListing(out []byte, learned func(set string) bool) (counts, string, error) {
	c := counts{chains: map[string]int{}, sets: map[string]int{}}
	l, err := nftjson.Parse(out)
	if err != nil {
		return c, "", err
	}
	for _, o := range l {
		switch o.Kind {
		case "chain":
			if name := o.String("name"); c.chains[name] == 0 {
				c.chains[name] = 0 // a chain without rules is listed too
			}
		case "rule":
			c.chains[o.String("chain")]++
		case "set", "map":
			c.sets[o.String("name")] = len(o.Elements())
			if learned(o.String("name")) {
				delete(o.Fields, "elem")
			}
		}
	}
	digest, err := l.Digest()
	return c, digest, err
}

// LearnedElement is what the kernel's DomainSet holds for an address: whether it holds it,
// the time left and the comment the learner wrote (the answer that admitted it).
type LearnedElement struct {
	Held             bool
	Expires, Comment string
}

var (
	expiresRE = regexp.MustCompile(`expires (\S+)`)
	commentRE = regexp.MustCompile(`comment "([^"]*)"`)
)

// Learned looks addr up in the kernel's DomainSet set (the Ruleset name, without family).
func Learned(ctx context.Context, set string, addr netip.Addr) (LearnedElement, error) {
	name := set + famSuffix(addr.Is6())
	out, err := exec.CommandContext(ctx, "nft", "get", "element", "inet", TableName, name, "{", addr.String(), "}").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return LearnedElement{}, nil
		}
		return LearnedElement{}, fmt.Errorf("set %s: %s", name, strings.TrimSpace(string(out)))
	}
	e := LearnedElement{Held: true}
	if m := expiresRE.FindStringSubmatch(string(out)); m != nil {
		e.Expires = strings.TrimSuffix(m[1], ",")
	}
	if m := commentRE.FindStringSubmatch(string(out)); m != nil {
		e.Comment = m[1]
	}
	return e, nil
}
