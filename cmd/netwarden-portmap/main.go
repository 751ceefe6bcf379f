// Command netwarden-portmap is a chained CNI plugin that maps host ports to a container.
package main

import (
	"github.com/netwarden/netwarden/internal/cni"
	"github.com/netwarden/netwarden/internal/cni/portmap"
)

func main() { cni.Main(portmap.Plugin{}) }
