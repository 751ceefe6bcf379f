// Package bench holds the kernel and agent benchmarks behind `make bench`, each measured from
// outside the code it times: full syncs, single events to the kernel, new-connection rates,
// latencies through the API server and the manifests directory.
package bench
