package iptables

import (
	"bufio"
	"bytes"
	"strings"
)

// saved is what a filter table listing says about our objects.
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
			if strings.HasPrefix(name, ChainPrefix) {
				st.ownChains = append(st.ownChains, name)
				st.rules[name] = nil
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			if strings.HasPrefix(chain, ChainPrefix) {
				st.rules[chain] = append(st.rules[chain], spec)
				continue
			}
			st.builtin[chain] = append(st.builtin[chain], spec)
			if strings.Contains(spec, "-j "+ChainPrefix) || strings.Contains(spec, "-g "+ChainPrefix) {
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
