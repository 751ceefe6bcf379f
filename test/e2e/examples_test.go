package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/demo"
	"github.com/netwarden/netwarden/internal/source/manifests"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// TestExampleVerdicts holds the demo's hand-written expectations (examples/expected-verdicts.yaml)
// against the independent NetworkPolicy oracle, and the oracle against the kernel: the example
// cluster and policies run through the agent on every backend and every probe (TCP, UDP, SCTP,
// both families) must match the oracle. A wrong line in the file, or a policy edit that changes
// a verdict without the file, fails here and not only in `make demo`.
func TestExampleVerdicts(t *testing.T) {
	t.Parallel()
	const examples = "../../examples"
	st := loadExamples(t, filepath.Join(examples, "manifests"), "cluster.yaml", "policies.yaml")
	forEachBackend(t, allBackends, func(t *testing.T, be backend) {
		w := newWorld(t, be, testbed.Routed, true, true)
		for name, ns := range st.Namespaces {
			w.addNamespace(name, ns.Labels)
		}
		var names []string
		for _, key := range slices.Sorted(st.Pods.Keys()) {
			p := st.Pods.Get(key)
			var ports []corev1.ContainerPort
			for _, cp := range p.Ports {
				ports = append(ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.Port, Protocol: cp.Protocol})
			}
			w.addPod(t, p.Namespace, p.Name, p.Labels, ports...)
			names = append(names, key)
		}
		for key, np := range st.Policies {
			w.policies[key] = np.DeepCopy()
		}
		want, err := demo.LoadExpected(filepath.Join(examples, demo.ExpectedVerdictsFile), names, demo.ProbePorts)
		if err != nil {
			t.Fatal(err)
		}
		o := w.buildOracle()
		for _, from := range names {
			for _, to := range names {
				if from == to {
					continue
				}
				src, dst := endpoint{key: from, pod: w.pods[from]}, endpoint{key: to, pod: w.pods[to]}
				for _, port := range demo.ProbePorts {
					for _, fam := range []int{4, 6} {
						got := w.expect(o, src, dst, w.tpods[from].IP(fam), w.tpods[to].IP(fam), port, testbed.TCP)
						if k := (demo.VerdictKey{From: from, To: to, Port: port}); got != want[k] {
							t.Errorf("%s -> %s TCP/%d over IPv%d: the oracle says %s, %s says %s",
								from, to, port, fam, verdict(got), demo.ExpectedVerdictsFile, verdict(want[k]))
						}
					}
				}
			}
		}
		if err := w.sim.StartAgent(); err != nil {
			t.Fatal(err)
		}
		w.apply(t)
		w.check(t, "the example policies")
	})
}

// loadExamples reads the named files of the examples directory as the agent would.
func loadExamples(t *testing.T, dir string, files ...string) *cluster.State {
	t.Helper()
	tmp := t.TempDir()
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, errs := manifests.Load(tmp, nil)
	if len(errs) > 0 {
		t.Fatalf("examples: %v", errs)
	}
	return st
}
