// Package cni drives the netwarden CNI plugins through libcni, chained after the upstream
// bridge and host-local plugins in network namespaces, on every backend.
package cni
