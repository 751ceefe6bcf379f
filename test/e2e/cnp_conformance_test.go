package e2e

// The upstream ClusterNetworkPolicy conformance suite (translated in
// cnpconformance_cases_test.go) with real packets: every test of it, on every backend, in both
// topologies of the test bed, IPv4 and IPv6.

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// The ports the suite's pods serve (base/manifests.yaml: TCP 80 and 8080, UDP 53 and 5353, SCTP
// 9003 and 9005; the host network pods the host network ports), served here by every pod and
// node of the bed.
var (
	confTCPPorts  = []uint16{80, 8080, uint16(hostPort(0)), uint16(hostPort(1))}
	confUDPPorts  = []uint16{53, 5353, uint16(hostPort(2)), uint16(hostPort(4))}
	confSCTPPorts = []uint16{9003, 9005, uint16(hostPort(6)), uint16(hostPort(7))}

	// After each step, the matrix: every pod to every other pod on these ports, and to every
	// address of every node on the node ports.
	confMatrixPodPorts  = []cnpPort{{testbed.TCP, 80}, {testbed.TCP, 8080}, {testbed.UDP, 53}, {testbed.SCTP, 9003}}
	confMatrixNodePorts = []cnpPort{{testbed.TCP, hostPort(0)}, {testbed.UDP, hostPort(2)}, {testbed.SCTP, hostPort(6)}}
)

// TestCNPConformanceKernel runs every translated upstream test against the agent: for each
// backend and topology, one two-node world (replica 0 of each StatefulSet on node-1, replica 1
// on node-2, an agent on each), in which the tests run one after the other as upstream runs
// them. A test's manifests are written as the upstream files (templated), its mutations as the
// objects after them; after each write the test waits for both agents' status to hold it. Each
// upstream poke is probed in each family and must match both the upstream expectation and the
// oracle; then the whole matrix must match the oracle. A denied probe must time out.
func TestCNPConformanceKernel(t *testing.T) {
	t.Parallel()
	runCNPWorlds(t, allCNPCombos(), func(t *testing.T, c cnpCombo) { runCNPConformance(t, c.be, c.topo) })
}

func runCNPConformance(t *testing.T, be backend, topo testbed.Topology) {
	start := time.Now()
	w := newCNPBed(t, be, topo, confTCPPorts, confUDPPorts, confSCTPPorts)
	var nodes []*corev1.Node
	for _, k := range sortedKeys(w.c.Nodes) {
		nodes = append(nodes, w.c.Nodes[k])
	}
	base, err := loadConfBase(func(ns, name string, replica int, hostNetwork bool) (string, []netip.Addr, error) {
		node := []string{w.sim.NodeName, "node-2"}[replica%2]
		ips, err := w.place(ns, name, node, hostNetwork)
		return node, ips, err
	}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	w.c = base
	w.start(t)
	pristine := base.DeepCopy()

	var total cnpResult
	steps, deniedSteps := 0, 0
	for _, ct := range confTests {
		t.Run(ct.Name, func(t *testing.T) {
			policyFile := "cnp-" + strings.ToLower(ct.Name) + ".yaml"
			text, err := applyConfManifests(w.c, ct.Manifests)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				// The test's objects go, and the labels its runs changed come back (upstream:
				// the manifests' and the runs' cleanups).
				deleteConfManifests(w.c)
				for k, ns := range pristine.Namespaces {
					w.c.Namespaces[k].Labels = ns.DeepCopy().Labels
				}
				for k, p := range pristine.Pods {
					w.c.Pods[k].Labels = p.DeepCopy().Labels
				}
				w.remove(t, policyFile)
				w.write(t, cnpClusterFile, w.clusterYAML(t))
				w.wait(t)
			}()
			batches := ct.batches()
			for bi, b := range batches {
				var did []string
				if bi == 0 {
					w.write(t, policyFile, text) // the upstream manifests as they are
					w.wait(t)
				} else {
					for _, m := range b.Mutations {
						if err := m.Apply(w.c); err != nil {
							t.Fatalf("%s: %v", m.Desc, err)
						}
						did = append(did, m.Desc)
					}
					w.sync(t, policyFile)
				}
				o := newCNPOracle(w.c)
				var cases []cnpCase
				for _, p := range b.Pokes {
					want := p.Want
					dst := w.c.Pods[confKey(p.To)]
					for _, ip := range podAddrs(dst) {
						c, ok := w.newCase(o, ct.Name+" / "+p.Run, confKey(p.From), confKey(p.To), ip,
							testbed.Protocol(strings.ToUpper(p.Proto)), p.Port)
						if ok {
							c.table = &want
							cases = append(cases, c)
						}
					}
				}
				pokes := len(cases)
				if topo == testbed.Routed {
					// The matrix in one topology: the bridged worlds run the same rules over
					// another path, which the upstream pokes cover, at a fraction of the load.
					cases = append(cases, w.matrix(o, confMatrixPodPorts, confMatrixNodePorts)...)
				}
				step := fmt.Sprintf("%s step %d (runs %q", ct.Name, bi, b.Runs)
				if len(b.Runs) == 0 {
					step = fmt.Sprintf("%s step %d (the manifests as applied, before any run", ct.Name, bi)
				}
				if len(did) > 0 {
					step += "; after: " + strings.Join(did, "; ")
				}
				step += ")"
				r := w.check(t, step, cases)
				if bi == len(batches)-1 {
					w.requireNoReject(t, step)
				}
				t.Logf("%s: %d upstream pokes and %d matrix probes (%d allowed, %d denied by the oracle)", step, pokes, r.probes-pokes, r.allowed, r.denied)
				total.probes += r.probes
				total.allowed += r.allowed
				total.denied += r.denied
				steps++
				if r.denied > 0 {
					deniedSteps++
				}
			}
		})
	}
	w.requireNoFallback(t)
	t.Logf("%s/%s: %d steps, %d probes (%d expected allowed, %d denied; %d steps have denied probes, each waits out a probe timeout), %s",
		be.name, topo, steps, total.probes, total.allowed, total.denied, deniedSteps, time.Since(start).Round(time.Millisecond))
}

// requireNoFallback fails if the agent ran on another backend than asked, or if an incremental
// sync fell back to a full one (which would hide a bug of the incremental path).
func (w *cnpWorld) requireNoFallback(t *testing.T) {
	t.Helper()
	log := w.sim.Log()
	if !strings.Contains(log, "backend="+w.be.name) {
		t.Errorf("the agent did not run on backend %s:\n%s", w.be.name, tail(log, 20))
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "fallbackReason") {
			t.Errorf("an incremental sync fell back to a full one: %s", line)
		}
	}
}
