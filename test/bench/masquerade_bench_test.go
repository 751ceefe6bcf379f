package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// BenchmarkMasqueradeAgent runs the real agent against a real kube-apiserver with 1,000
// non-masquerade CIDRs in its config, and reports, from the change to the agent's log line
// that follows the kernel transaction: a config file edit that adds one CIDR and one that
// removes it (the file replaced as a ConfigMap update does), and a Node created through the
// API (its podCIDR outside every configured range).
func BenchmarkMasqueradeAgent(b *testing.B) {
	requireRoot(b)
	srv := kubetest.Start(b, kubetest.Options{})
	client := srv.AdminClient(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{IPv4: true, IPv6: true, TCPPorts: []uint16{}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	if err := sim.ForwardFromNode(strings.TrimPrefix(srv.URL, "https://")); err != nil {
		b.Fatal(err)
	}
	cfg := sim.Bed.Config()
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: sim.NodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{cfg.PodCIDRv4.String(), cfg.PodCIDRv6.String()}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	cidrs := make([]string, 0, 1001)
	for i := range 1000 {
		cidrs = append(cidrs, fmt.Sprintf("100.%d.%d.0/24", 64+i/128, 2*(i%128)))
	}
	path := filepath.Join(b.TempDir(), "config")
	writeConfig := func(cidrs []string) string {
		b.Helper()
		data := "cidrLimit: 2000\nnonMasqueradeCIDRs:\n  - " + strings.Join(cidrs, "\n  - ") + "\n"
		if err := os.WriteFile(path+".tmp", []byte(data), 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			b.Fatal(err)
		}
		return data
	}
	base := writeConfig(cidrs)

	// applied waits for the agent's status to report the write applied: the config content
	// last written, or the Node created (by its resourceVersion).
	applied := func(t0 time.Time, what string, done func(*statusapi.FeatureStatus) bool) time.Duration {
		b.Helper()
		if err := sim.WaitStatus(30*time.Second, what, func(st statusapi.Status) bool { return st.Masquerade != nil && done(st.Masquerade) }); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	configApplied := func(data string) func(*statusapi.FeatureStatus) bool {
		sum := statusapi.ContentHash([]byte(data))
		return func(m *statusapi.FeatureStatus) bool { return m.Config == sum }
	}
	var configChange, configRemove, nodeAdd, nodeAddInAgent []time.Duration
	// sinceEvent is the agent's own measure of the last sync (see syncTimings).
	sinceEvent := func() time.Duration {
		b.Helper()
		syncs := syncTimings(b, sim.Log(), `msg="masquerade synced"`)
		if len(syncs) == 0 {
			b.Fatal("no masquerade synced line in the log")
		}
		d, ok := syncs[len(syncs)-1]["sinceEvent"]
		if !ok {
			b.Fatal("no sinceEvent in the last masquerade synced line")
		}
		return d
	}
	for b.Loop() {
		if err := sim.StartAgentArgs("--kubeconfig", srv.Kubeconfig(b, ""), "--log-level", "info", "--network-policy=false", "--masq-config", path); err != nil {
			b.Fatal(err)
		}
		if err := sim.WaitStatus(time.Minute, "ready", func(st statusapi.Status) bool { return st.Ready }); err != nil {
			b.Fatal(err)
		}
		for i := range 20 {
			t0 := time.Now()
			data := writeConfig(append(slices.Clone(cidrs), fmt.Sprintf("198.18.%d.0/24", 2*i)))
			configChange = append(configChange, applied(t0, "config change", configApplied(data)))

			// Back to the base config: a CIDR removed is an element deleted (see docs/performance.md
			// for why that no longer waits for an RCU grace period).
			t0 = time.Now()
			writeConfig(cidrs)
			configRemove = append(configRemove, applied(t0, "config change", configApplied(base)))

			t0 = time.Now()
			name := fmt.Sprintf("bench-node-%d-%d", len(nodeAdd), i)
			node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.NodeSpec{PodCIDRs: []string{fmt.Sprintf("172.30.%d.0/24", len(nodeAdd)), fmt.Sprintf("fd00:30:%x::/64", len(nodeAdd))}}}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			rv := cluster.ParseResourceVersion(node.ResourceVersion)
			nodeAdd = append(nodeAdd, applied(t0, "node add", func(m *statusapi.FeatureStatus) bool { return m.Revision.Covers("nodes", rv) }))
			nodeAddInAgent = append(nodeAddInAgent, sinceEvent())
		}
		if err := sim.StopAgent(); err != nil {
			b.Fatal(err)
		}
	}
	sortDurations(configChange)
	sortDurations(configRemove)
	sortDurations(nodeAdd)
	sortDurations(nodeAddInAgent)
	b.ReportMetric(ms(configChange[len(configChange)/2]), "config-add-cidr-p50-ms")
	b.ReportMetric(ms(configChange[len(configChange)-1]), "config-add-cidr-max-ms")
	b.ReportMetric(ms(configRemove[len(configRemove)/2]), "config-remove-cidr-p50-ms")
	b.ReportMetric(ms(configRemove[len(configRemove)-1]), "config-remove-cidr-max-ms")
	b.ReportMetric(ms(nodeAdd[len(nodeAdd)/2]), "node-add-p50-ms")
	b.ReportMetric(ms(nodeAdd[len(nodeAdd)-1]), "node-add-max-ms")
	b.ReportMetric(ms(nodeAddInAgent[len(nodeAddInAgent)/2]), "node-add-event-to-kernel-p50-ms")
	b.ReportMetric(ms(nodeAddInAgent[len(nodeAddInAgent)-1]), "node-add-event-to-kernel-max-ms")
}
