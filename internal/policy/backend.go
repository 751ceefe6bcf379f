package policy

import "github.com/netwarden/netwarden/internal/dataplane"

// Backend programs a Ruleset into the kernel: the NetworkPolicy backends (nftables, iptables).
type Backend = dataplane.Backend[*Ruleset]
