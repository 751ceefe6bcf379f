package nftables

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// TestGroupedFullSyncEqualsOneElementPerCommand loads the benchmark cluster's table twice into
// the kernel, once as the backend's full sync writes it (a set's elements in commands of up
// to elementsPerCommand) and once as `render` prints it (one element per command), and checks
// that the kernel holds the same table both times.
func TestGroupedFullSyncEqualsOneElementPerCommand(t *testing.T) {
	spec := synth.Default()
	rs, _ := policy.Compile(synth.Generate(spec), spec.LocalNode)
	r := Render(rs)
	largest, maps := 0, 0
	for _, s := range r.Sets {
		largest = max(largest, len(s.elements()))
		if s.isMap {
			maps++
		}
	}
	if largest <= elementsPerCommand || maps == 0 {
		t.Fatalf("the cluster no longer has a set of more than %d elements (largest %d) and a map (%d): the test would not split any", elementsPerCommand, largest, maps)
	}
	inFreshNetNS(t, func() {
		ctx := context.Background()
		be, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := be.FullSyncRendered(ctx, r); err != nil {
			t.Fatal(err)
		}
		grouped := listTableSorted(t)
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
			t.Fatalf("the kernel holds another table after the grouped full sync (%d bytes) than after one element per command (%d bytes)", len(grouped), len(single))
		}
	})
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
