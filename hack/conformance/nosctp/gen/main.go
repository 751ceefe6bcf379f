// Command gen writes the network-policy-api conformance suite's manifests (the files embedded in
// sigs.k8s.io/network-policy-api/conformance) into a directory, without the containers that serve
// SCTP: on a kernel without SCTP they exit at once (agnhost porter cannot listen), and no pod of
// the suite's base StatefulSets would ever be Ready. Only container entries whose environment
// names SERVE_SCTP_PORT_ are dropped; every other line is kept as published.
package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/network-policy-api/conformance"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gen DIR")
		os.Exit(2)
	}
	out := os.Args[1]
	dropped := 0
	err := fs.WalkDir(conformance.Manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := conformance.Manifests.ReadFile(path)
		if err != nil {
			return err
		}
		text, n := dropSCTPContainers(string(data))
		dropped += n
		dst := filepath.Join(out, path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, []byte(text), 0o644)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "gen: wrote the suite's manifests to %s without %d SCTP server containers\n", out, dropped)
}

// dropSCTPContainers removes the list items of every "containers:" list whose lines mention
// SERVE_SCTP_PORT_.
func dropSCTPContainers(text string) (string, int) {
	lines := strings.Split(text, "\n")
	var out []string
	dropped := 0
	for i := 0; i < len(lines); {
		line := lines[i]
		out = append(out, line)
		i++
		if strings.TrimSpace(line) != "containers:" {
			continue
		}
		for i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "- ") {
			item := strings.Index(lines[i], "- ")
			end := i + 1
			for end < len(lines) && (strings.TrimSpace(lines[end]) == "" || indent(lines[end]) > item) {
				end++
			}
			block := lines[i:end]
			if strings.Contains(strings.Join(block, "\n"), "SERVE_SCTP_PORT_") {
				dropped++
			} else {
				out = append(out, block...)
			}
			i = end
		}
	}
	return strings.Join(out, "\n"), dropped
}

func indent(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
