package kubetest

// TB is the part of testing.TB that the kits use. Tests pass their *testing.T or *testing.B; a
// command that runs a cluster outside `go test` (make cluster-up) passes its own, whose Fatal
// ends the command and whose Cleanup runs at its shutdown.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}
