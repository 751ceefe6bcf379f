// Package e2e proves NetworkPolicy and ClusterNetworkPolicy enforcement end to end: packets
// between network-namespace pods compared with an independent oracle, on every backend, from
// manifests and from the real API.
package e2e
