// Command netwarden is the node network agent.
package main

import (
	"os"

	"github.com/netwarden/netwarden/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
