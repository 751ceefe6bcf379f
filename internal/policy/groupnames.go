package policy

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// groupNamer keeps the names of one dispatch map's groups stable across compiles.
//
// A group is first named by a hash of its chains. When a change alters the chains of pods that
// shared a group (a policy that selects a whole namespace, a ClusterNetworkPolicy whose subject
// is every namespace), the new group inherits the name of the old group most of its pods were
// in. The kernel then rewrites one chain per group instead of re-pointing each pod's element in
// the dispatch map and replacing the group chains: tens of operations instead of a thousand.
// Names therefore depend on history; verdicts never do.
type groupNamer struct {
	byChains map[string]string // joined chains -> group name, as of the last compile
	ofPod    map[string]string // pod key -> the name of its group, as of the last compile
}

// groupMembers is one group of a compile: the chains judging its pods, and the pods.
type groupMembers struct {
	key    string // the chains joined, the group's identity within one compile
	chains []string
	pods   []string
}

// assign names the groups of byPod (pod key -> the chains judging it) and returns each pod's
// group name and each name's chains. fresh names a group that inherits no name.
func (gn *groupNamer) assign(byPod map[string][]string, fresh func(chains []string) string) (map[string]string, map[string][]string) {
	pods := make([]string, 0, len(byPod))
	for pk := range byPod {
		pods = append(pods, pk)
	}
	sort.Strings(pods)
	byKey := map[string]*groupMembers{}
	var groups []*groupMembers
	for _, pk := range pods {
		chains := byPod[pk]
		key := strings.Join(chains, "\n")
		g := byKey[key]
		if g == nil {
			g = &groupMembers{key: key, chains: chains}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.pods = append(g.pods, pk)
	}

	names := make(map[string]string, len(groups)) // key -> name
	claimed := make(map[string]bool, len(groups))
	for _, g := range groups {
		if n, ok := gn.byChains[g.key]; ok {
			names[g.key], claimed[n] = n, true
		}
	}
	// Bigger groups choose first: they have the most elements to keep in place.
	pending := make([]*groupMembers, 0, len(groups)-len(names))
	for _, g := range groups {
		if _, ok := names[g.key]; !ok {
			pending = append(pending, g)
		}
	}
	slices.SortStableFunc(pending, func(a, b *groupMembers) int { return len(b.pods) - len(a.pods) })
	for _, g := range pending {
		votes := map[string]int{}
		best := ""
		for _, pk := range g.pods {
			n, ok := gn.ofPod[pk]
			if !ok || claimed[n] {
				continue
			}
			votes[n]++
			if v := votes[n]; best == "" || v > votes[best] || (v == votes[best] && n < best) {
				best = n
			}
		}
		if best != "" {
			names[g.key], claimed[best] = best, true
		}
	}
	for _, g := range pending {
		if _, ok := names[g.key]; ok {
			continue
		}
		base := fresh(g.chains)
		n := base
		for i := 1; claimed[n]; i++ {
			n = fmt.Sprintf("%s-%d", base, i)
		}
		names[g.key], claimed[n] = n, true
	}

	ofPod := make(map[string]string, len(byPod))
	chainsOf := make(map[string][]string, len(groups))
	for _, g := range groups {
		n := names[g.key]
		chainsOf[n] = g.chains
		for _, pk := range g.pods {
			ofPod[pk] = n
		}
	}
	gn.byChains, gn.ofPod = names, ofPod
	return ofPod, chainsOf
}
