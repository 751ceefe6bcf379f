package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/synth"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// writeList writes objects as one JSON List file, which the manifests source reads fastest.
func writeList(dir, name string, items []any) error {
	b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), b, 0o644)
}

// BenchmarkAgentAtScale runs the real agent binary on the benchmark cluster read from
// manifests, and reports the time from start to ready and the agent's resident memory.
func BenchmarkAgentAtScale(b *testing.B) {
	requireRoot(b)
	bin, err := simnode.AgentBinary()
	if err != nil {
		b.Skip(err)
	}
	spec := synth.Default()
	st := synth.Generate(spec)
	var nss, pods, pols []any
	for _, ns := range st.Namespaces {
		ns = ns.DeepCopy()
		ns.APIVersion, ns.Kind = "v1", "Namespace"
		nss = append(nss, ns)
	}
	for _, p := range st.Pods.All() {
		pods = append(pods, p.APIObject())
	}
	for _, np := range st.Policies {
		np = np.DeepCopy()
		np.APIVersion, np.Kind = "networking.k8s.io/v1", "NetworkPolicy"
		pols = append(pols, np)
	}
	_ = corev1.Pod{}
	_ = networkingv1.NetworkPolicy{}
	sim, err := simnode.New(simnode.Options{AgentBin: bin, NodeName: spec.LocalNode,
		Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, TCPPorts: []uint16{80}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	for name, items := range map[string][]any{"namespaces.json": nss, "pods.json": pods, "policies.json": pols} {
		if err := writeList(sim.Dir, name, items); err != nil {
			b.Fatal(err)
		}
	}
	var ready time.Duration
	var rss, hwm int
	for b.Loop() {
		start := time.Now()
		if err := sim.StartAgent("--log-level", "info"); err != nil {
			b.Fatal(err)
		}
		if err := sim.WaitStatus(2*time.Minute, "ready", func(st statusapi.Status) bool { return st.Ready }); err != nil {
			b.Fatal(err)
		}
		ready = time.Since(start)
		time.Sleep(2 * time.Second) // let the first sync's garbage be collected
		rss, hwm = agentMemory(b, sim)
		if err := sim.StopAgent(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ms(ready), "ready-ms")
	b.ReportMetric(float64(rss)/1024, "rss-MiB")
	b.ReportMetric(float64(hwm)/1024, "peak-rss-MiB")
}

// agentMemory reads VmRSS and VmHWM (KiB) of the running agent.
func agentMemory(b *testing.B, sim *simnode.Sim) (rss, hwm int) {
	pid := sim.AgentPID()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm
}
