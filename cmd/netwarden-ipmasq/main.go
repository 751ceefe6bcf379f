// Command netwarden-ipmasq is a chained CNI plugin that masquerades a container's traffic
// leaving its subnets.
package main

import (
	"github.com/netwarden/netwarden/internal/cni"
	"github.com/netwarden/netwarden/internal/cni/ipmasq"
)

func main() { cni.Main(ipmasq.Plugin{}) }
