// Command netwarden-demo runs the single-machine demo behind `make demo`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/netwarden/netwarden/internal/demo"
)

func main() {
	agent := flag.String("agent", "bin/netwarden", "path to the netwarden binary")
	examples := flag.String("examples", "examples", "directory holding cluster.yaml and policies.yaml")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "netwarden-demo: run as root: it creates network namespaces and nftables tables inside them")
		os.Exit(1)
	}
	if err := demo.Run(os.Stdout, *agent, *examples); err != nil {
		fmt.Fprintln(os.Stderr, "netwarden-demo:", err)
		os.Exit(1)
	}
}
