package nftables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// TestGroupedFullSyncEqualsOneElementPerCommand loads the benchmark cluster's table into the
// kernel as the backend's full sync writes it, over netlink and through nft (a set's elements
// in commands of up to elementsPerCommand), and once as `render` prints it (one element per
// command), and checks that the kernel holds the same table each time: the same listing, the
// same rule expressions and the same set elements.
func TestGroupedFullSyncEqualsOneElementPerCommand(t *testing.T) {
	spec := synth.Default()
	rs, _ := policy.Compile(synth.Generate(spec), spec.LocalNode)
	r := Render(rs)
	largest, maps := 0, 0
	for _, s := range r.Sets {
		largest = max(largest, len(s.Elements()))
		if s.isMap {
			maps++
		}
	}
	if largest <= elementsPerCommand || maps == 0 {
		t.Fatalf("the cluster no longer has a set of more than %d elements (largest %d) and a map (%d): the test would not split any", elementsPerCommand, largest, maps)
	}
	if !fullNetlinkable(r) {
		t.Fatal("the benchmark cluster's table cannot be written over netlink: a full sync at scale would go through nft")
	}
	for _, viaNetlink := range []bool{true, false} {
		inFreshNetNS(t, func() {
			ctx := context.Background()
			be, err := New()
			if err != nil {
				t.Fatal(err)
			}
			be.netlink = viaNetlink
			if _, err := be.FullSyncRendered(ctx, r); err != nil {
				t.Fatal(err)
			}
			grouped, groupedExprs, groupedElems := listTableSorted(t), ruleExprs(t), setElements(t)
			if err := be.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = strings.NewReader(Dump(r))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft -f of the rendered table: %v\n%s", err, out)
			}
			if single := listTableSorted(t); grouped != single {
				if dir := os.Getenv("NFT_TEST_DUMP"); dir != "" {
					_ = os.WriteFile(dir+"/grouped.nft", []byte(grouped), 0o644)
					_ = os.WriteFile(dir+"/single.nft", []byte(single), 0o644)
				}
				t.Fatalf("netlink %v: the kernel holds another table after the full sync (%d bytes) than after one element per command (%d bytes)",
					viaNetlink, len(grouped), len(single))
			}
			if single := ruleExprs(t); groupedExprs != single {
				t.Fatalf("netlink %v: rule expressions differ from those of one element per command:\n%s", viaNetlink, firstDifference(groupedExprs, single))
			}
			if single := setElements(t); groupedElems != single {
				t.Fatalf("netlink %v: set elements differ from those of one element per command:\n%s", viaNetlink, firstDifference(groupedElems, single))
			}
		})
	}
}

// firstDifference shows the first line where a and b differ, with its neighbours.
func firstDifference(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(la), len(lb)); i++ {
		if i >= len(la) || i >= len(lb) || la[i] != lb[i] {
			from, to := max(0, i-3), i+3
			return fmt.Sprintf("line %d:\n got: %s\nwant: %s", i+1, strings.Join(la[from:min(to, len(la))], "\n      "), strings.Join(lb[from:min(to, len(lb))], "\n      "))
		}
	}
	return ""
}

var elementsBlock = regexp.MustCompile(`(?s)elements = \{([^}]*)\}`)

// listTableSorted lists the table with its objects, and each set's elements, in sorted order:
// the kernel lists both in the order they went in.
func listTableSorted(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	sorted := elementsBlock.ReplaceAllStringFunc(string(out), func(block string) string {
		body := elementsBlock.FindStringSubmatch(block)[1]
		var items []string
		for _, it := range strings.Split(body, ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		slices.Sort(items)
		return "elements = { " + strings.Join(items, ", ") + " }"
	})
	// The kernel lists objects in the order they were made; Dump writes them in its own.
	objects := strings.Split(sorted, "\n\n")
	slices.Sort(objects)
	return strings.Join(objects, "\n\n")
}
