package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/synth"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// manifestsChanges is how many changes of each kind BenchmarkManifestsDirectory measures.
const manifestsChanges = 30

// BenchmarkManifestsDirectory runs the real agent binary on the benchmark cluster written as
// one file per object, and measures from outside the agent:
//   - the wall time of `agent --once` on that directory (cold start: load, compile, apply);
//   - one file replaced (written beside it and renamed over it, as editors and simnode do) →
//     the agent's /status says its content is applied to the kernel, for a pod's label changed
//     and for a new policy, p50 and p99 of manifestsChanges each; for the label, also until
//     established flows are re-judged by the new rules ("label-established");
//   - the long-running agent's resident memory (VmRSS) right after those changes and once it
//     has been quiet for a few seconds, and its peak (VmHWM, which the cold start's load sets).
func BenchmarkManifestsDirectory(b *testing.B) {
	requireRoot(b)
	bin, err := simnode.AgentBinary()
	if err != nil {
		b.Skip(err)
	}
	spec := synth.Default()
	sim, err := simnode.New(simnode.Options{AgentBin: bin, NodeName: spec.LocalNode,
		Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, TCPPorts: []uint16{80}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	files, err := synth.WriteObjectFiles(sim.Dir, synth.Generate(synth.Default()))
	if err != nil {
		b.Fatal(err)
	}
	base := synth.Generate(spec)
	pod := base.Pods.Get("ns-00001/pod-000001").APIObject() // as synth.WriteObjectFiles writes it
	podFile := fmt.Sprintf("pod-%s-%s.yaml", pod.Namespace, pod.Name)
	if _, err := os.Stat(filepath.Join(sim.Dir, podFile)); err != nil {
		b.Fatal(err)
	}

	var once time.Duration
	var labels, labelsEstablished, policies []time.Duration
	var rss, hwm, idleRSS int
	run := 0
	for b.Loop() {
		run++
		start := time.Now()
		if out, err := sim.RunAgent(context.Background(), "agent", "--once", "--health-addr", "", "--log-level", "warn",
			"--manifests", sim.Dir, "--node-name", sim.NodeName); err != nil {
			b.Fatalf("agent --once: %v\n%s", err, out)
		}
		once = time.Since(start)

		if err := sim.StartAgent("--log-level", "info"); err != nil {
			b.Fatal(err)
		}
		if err := sim.WaitStatus(2*time.Minute, "ready", func(st statusapi.Status) bool { return st.Ready }); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < manifestsChanges; i++ {
			pod.Labels["app"] = fmt.Sprintf("app-%d", 1+(run*manifestsChanges+i)%9)
			data, err := yaml.Marshal(pod)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := sim.WriteFile(podFile, data); err != nil {
				b.Fatal(err)
			}
			if err := sim.WaitApplied(30 * time.Second); err != nil {
				b.Fatal(err)
			}
			labels = append(labels, time.Since(start))
			// A label change may deny flows (the pod leaves peer sets): the conntrack walk
			// that flags them follows, beside the sync loop.
			if err := sim.WaitEstablished(30 * time.Second); err != nil {
				b.Fatal(err)
			}
			labelsEstablished = append(labelsEstablished, time.Since(start))

			np := &networkingv1.NetworkPolicy{
				TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns-00002", Name: fmt.Sprintf("bench-%d-%d", run, i)},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}, Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%10)}}}},
				}}},
			}
			if data, err = yaml.Marshal(np); err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			if err := sim.WriteFile(fmt.Sprintf("np-%s-%s.yaml", np.Namespace, np.Name), data); err != nil {
				b.Fatal(err)
			}
			if err := sim.WaitApplied(30 * time.Second); err != nil {
				b.Fatal(err)
			}
			policies = append(policies, time.Since(start))
		}
		rss, hwm = agentMemory(b, sim)
		// And once it has been quiet for a while, as a node agent mostly is: it gives back
		// what the changes' garbage took (see agent.releaseWhenQuiet).
		time.Sleep(4 * time.Second)
		idleRSS, _ = agentMemory(b, sim)
		if err := sim.StopAgent(); err != nil {
			b.Fatal(err)
		}
		// The next run starts from the directory as it was.
		for i := 0; i < manifestsChanges; i++ {
			if err := sim.RemoveFile(fmt.Sprintf("np-ns-00002-bench-%d-%d.yaml", run, i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(files), "files")
	b.ReportMetric(ms(once), "once-ms")
	b.ReportMetric(float64(rss)/1024, "rss-MiB")
	b.ReportMetric(float64(idleRSS)/1024, "idle-rss-MiB")
	b.ReportMetric(float64(hwm)/1024, "peak-rss-MiB")
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"label", labels}, {"label-established", labelsEstablished}, {"policy", policies}} {
		slices.Sort(m.d)
		b.ReportMetric(ms(m.d[len(m.d)/2]), m.name+"-p50-ms")
		b.ReportMetric(ms(m.d[len(m.d)*99/100]), m.name+"-p99-ms")
	}
}
