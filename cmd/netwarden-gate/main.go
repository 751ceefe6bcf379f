// Command netwarden-gate is a chained CNI plugin that returns from ADD only once the node's
// netwarden agent has installed the pod's verdicts (see internal/cni/gate).
package main

import "github.com/netwarden/netwarden/internal/cni/gate"

func main() { gate.Main() }
