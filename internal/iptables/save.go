package iptables

import (
	"bufio"
	"bytes"
	"strings"

	"github.com/netwarden/netwarden/internal/guard"
)

// isOurChain reports whether chain is one of the NetworkPolicy backend's. The guard's chains share
// the mangle table and the prefix, and are the guard's to keep.
func isOurChain(chain string) bool {
	return strings.HasPrefix(chain, ChainPrefix) && chain != guard.IPTablesChain && chain != guard.IPTablesForwardChain
}

// jumpsToOurs reports whether a rule spec jumps or goes to one of our chains.
func jumpsToOurs(spec string) bool {
	for _, verb := range []string{"-j ", "-g "} {
		if i := strings.Index(spec, verb+ChainPrefix); i >= 0 {
			target, _, _ := strings.Cut(spec[i+len(verb):], " ")
			if isOurChain(target) {
				return true
			}
		}
	}
	return false
}

// saved is what a table listing says about our objects.
type saved struct {
	ownChains []string
	rules     map[string][]string // our chains' rule specs, in order
	jumps     [][2]string         // rules in built-in chains that jump to ours
	builtin   map[string][]string // specs of the built-in chains' rules
}

func parseSave(out []byte) saved {
	st := saved{rules: map[string][]string{}, builtin: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if isOurChain(name) {
				st.ownChains = append(st.ownChains, name)
				st.rules[name] = nil
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			if isOurChain(chain) {
				st.rules[chain] = append(st.rules[chain], spec)
				continue
			}
			if strings.HasPrefix(chain, ChainPrefix) {
				continue // the guard's
			}
			st.builtin[chain] = append(st.builtin[chain], spec)
			if jumpsToOurs(spec) {
				st.jumps = append(st.jumps, [2]string{chain, spec})
			}
		}
	}
	return st
}

// parseIPSetSave returns the members of each set in `ipset save` output.
func parseIPSetSave(out []byte) map[string][]string {
	sets := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "create":
			if _, ok := sets[f[1]]; !ok {
				sets[f[1]] = []string{}
			}
		case len(f) >= 3 && f[0] == "add":
			sets[f[1]] = append(sets[f[1]], f[2])
		}
	}
	return sets
}
