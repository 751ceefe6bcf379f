package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/guard"
	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// backend is a NetworkPolicy backend the behavioural tests run against: nftables, or the
// iptables backend on one of the two iptables variants.
type backend struct {
	name string // what the agent reports (Name(), the metrics' backend label)
	flag string // --backend
	mode string // $NETWARDEN_IPTABLES_MODE, for the iptables backend
}

var (
	nftablesBackend = backend{name: "nftables", flag: "nftables"}
	iptablesNFT     = backend{name: "iptables-nft", flag: "iptables", mode: "nft"}
	iptablesLegacy  = backend{name: "iptables-legacy", flag: "iptables", mode: "legacy"}

	// allBackends run every behavioural test.
	allBackends = []backend{nftablesBackend, iptablesNFT, iptablesLegacy}
	// iptablesBackends run the tests about living next to other iptables users.
	iptablesBackends = []backend{iptablesNFT, iptablesLegacy}
)

func (be backend) iptables() bool { return be.flag == "iptables" }

// forEachBackend runs f as a parallel subtest per backend.
func forEachBackend(t *testing.T, backends []backend, f func(t *testing.T, be backend)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			f(t, be)
		})
	}
}

// agentBinary returns the agent binary wrapped to use be (simnode.BackendBinary), so every way
// a test starts the binary uses be.
func agentBinary(t *testing.T, be backend) string {
	t.Helper()
	bin, err := simnode.BackendBinary(be.flag, be.mode)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// settledKernelState is kernelState once the agent has applied the state written and the
// removals that changes deferred (iptables-nft compacts after --compact-delay of quiet), as its
// status reports.
func settledKernelState(ctx context.Context, t *testing.T, sim *simnode.Sim, be backend) string {
	t.Helper()
	if err := sim.WaitStatus(30*time.Second, "the written state, compacted", func(st statusapi.Status) bool {
		return sim.Applied(st) && st.NetworkPolicy != nil && !st.NetworkPolicy.CompactionPending
	}); err != nil {
		t.Fatal(err)
	}
	return kernelState(ctx, sim.Bed, be)
}

// kernelState prints what the backend holds in the node netns, in a canonical order, so two
// states can be compared and a failure shows the rules.
func kernelState(ctx context.Context, bed *testbed.Bed, be backend) string {
	if !be.iptables() {
		out, err := bed.NodeExec(ctx, "nft", "list", "table", "inet", "netwarden")
		if err != nil {
			return fmt.Sprintf("nft list table: %v %s", err, out)
		}
		return sortedElements(string(out))
	}
	var sb strings.Builder
	for _, cmd := range []string{"iptables-" + be.mode + "-save", "ip6tables-" + be.mode + "-save"} {
		out, err := bed.NodeExec(ctx, cmd, "-t", "mangle")
		if err != nil {
			fmt.Fprintf(&sb, "%s: %v %s\n", cmd, err, out)
			continue
		}
		fmt.Fprintf(&sb, "# %s\n", cmd)
		for _, l := range strings.Split(string(out), "\n") {
			// The guard's chains share the mangle table; like its sets (below), they belong
			// to the long-running agent only.
			if strings.HasPrefix(l, "#") || strings.Contains(l, guard.IPTablesChain) {
				continue
			}
			sb.WriteString(strings.Split(l, " [")[0] + "\n") // without counters
		}
	}
	out, err := bed.NodeExec(ctx, "ipset", "save")
	if err != nil {
		fmt.Fprintf(&sb, "ipset save: %v %s\n", err, out)
	}
	var sets []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// The guard's sets belong to the long-running agent only (--once installs no guard,
		// since nothing would be left to admit new pods); the guard has its own tests.
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], guard.IPSetPrefix) {
			continue
		}
		sets = append(sets, createHead(l))
	}
	sort.Strings(sets)
	sb.WriteString("# ipset save (sorted)\n" + strings.Join(sets, "\n") + "\n")
	return sb.String()
}

// sortedElements puts an nft listing in a canonical form: the table's sets, maps and chains in
// name order (nft lists them in creation order), and the elements inside each
// "elements = { ... }" sorted (nft prints them in hash order). Rule order within a chain stays.
func sortedElements(listing string) string {
	var blocks []string
	var cur []string
	for _, l := range strings.Split(listing, "\n") {
		if i := strings.Index(l, "elements = {"); i >= 0 && strings.HasSuffix(strings.TrimSpace(l), "}") {
			inner := strings.TrimSuffix(strings.TrimSpace(l[i+len("elements = {"):]), "}")
			elems := strings.Split(inner, ",")
			for j := range elems {
				elems[j] = strings.TrimSpace(elems[j])
			}
			sort.Strings(elems)
			l = l[:i] + "elements = { " + strings.Join(elems, ", ") + " }"
		}
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "table ") {
			continue
		}
		cur = append(cur, l)
		if l == "\t}" {
			blocks = append(blocks, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	sort.Strings(blocks)
	return strings.Join(blocks, "\n\n") + "\n" + strings.Join(cur, "\n")
}

// ourObjects lists every chain, jump and set of ours that either iptables variant or ipset
// holds in the node netns, for cleanup checks.
func ourObjects(ctx context.Context, t *testing.T, bed *testbed.Bed) []string {
	t.Helper()
	var found []string
	for _, mode := range []string{"nft", "legacy"} {
		for _, cmd := range []string{"iptables-" + mode + "-save", "ip6tables-" + mode + "-save"} {
			// The guard's chains are in mangle.
			for _, table := range []string{"filter", "mangle"} {
				out, err := bed.NodeExec(ctx, cmd, "-t", table)
				if err != nil {
					t.Fatalf("%s: %v %s", cmd, err, out)
				}
				for _, l := range strings.Split(string(out), "\n") {
					if strings.Contains(l, "NETWARDEN-") {
						found = append(found, cmd+" -t "+table+": "+l)
					}
				}
			}
		}
	}
	out, err := bed.NodeExec(ctx, "ipset", "list", "-n")
	if err != nil {
		t.Fatalf("ipset list: %v %s", err, out)
	}
	for _, n := range strings.Fields(string(out)) {
		if strings.HasPrefix(n, "netwarden-") || strings.HasPrefix(n, "nwguard-") {
			found = append(found, "ipset: "+n)
		}
	}
	if out, err := bed.NodeExec(ctx, "nft", "list", "tables"); err == nil && strings.Contains(string(out), "netwarden") {
		found = append(found, "nft: "+strings.TrimSpace(string(out)))
	}
	return found
}

// createHead cuts an `ipset save` create line after the family: the table size grows with
// use and the hash seed is random, neither is content.
func createHead(line string) string {
	f := strings.Fields(line)
	if len(f) > 5 && f[0] == "create" && f[3] == "family" {
		return strings.Join(f[:5], " ")
	}
	return line
}
