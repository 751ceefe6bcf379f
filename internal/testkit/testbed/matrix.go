package testbed

import (
	"fmt"
	"strings"
)

// FormatMatrix renders a reachability matrix for test failure messages:
// rows are sources, columns destinations, "." means allowed/reachable and
// "X" blocked/unreachable.
func FormatMatrix(rows, cols []string, allowed func(r, c int) bool) string {
	return formatGrid(rows, cols, func(r, c int) string {
		if allowed(r, c) {
			return "."
		}
		return "X"
	})
}

// FormatMatrixDiff renders expected vs. actual: "." / "X" where they agree
// (reachable / unreachable), "!." where the probe succeeded but was expected
// to fail, and "!X" where it failed but was expected to succeed.
func FormatMatrixDiff(rows, cols []string, expected, actual func(r, c int) bool) string {
	return formatGrid(rows, cols, func(r, c int) string {
		e, a := expected(r, c), actual(r, c)
		switch {
		case e && a:
			return "."
		case !e && !a:
			return "X"
		case a:
			return "!."
		default:
			return "!X"
		}
	})
}

func formatGrid(rows, cols []string, cell func(r, c int) string) string {
	rw := 0
	for _, r := range rows {
		rw = max(rw, len(r))
	}
	cw := make([]int, len(cols))
	cells := make([][]string, len(rows))
	for c, name := range cols {
		cw[c] = max(len(name), 2)
	}
	for r := range rows {
		cells[r] = make([]string, len(cols))
		for c := range cols {
			cells[r][c] = cell(r, c)
			cw[c] = max(cw[c], len(cells[r][c]))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-*s |", rw, "")
	for c, name := range cols {
		fmt.Fprintf(&sb, " %-*s", cw[c], name)
	}
	sb.WriteString("\n")
	sb.WriteString(strings.Repeat("-", rw+1) + "+")
	for c := range cols {
		sb.WriteString(strings.Repeat("-", cw[c]+1))
	}
	sb.WriteString("\n")
	for r, name := range rows {
		fmt.Fprintf(&sb, "%-*s |", rw, name)
		for c := range cols {
			fmt.Fprintf(&sb, " %-*s", cw[c], cells[r][c])
		}
		sb.WriteString("\n")
	}
	return sb.String()
}
