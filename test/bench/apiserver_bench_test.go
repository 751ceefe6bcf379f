package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/source/kubeapi"
	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/synth"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// parallel runs fn over items with a few workers and stops at the first error.
func parallel[T any](items []T, fn func(T) error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	ch := make(chan T)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				if err := fn(it); err != nil {
					once.Do(func() { first = err })
				}
			}
		}()
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
	return first
}

// loadCluster creates the synthetic cluster through the API, pod status written as kubelets
// would.
func loadCluster(ctx context.Context, c kubernetes.Interface, spec synth.Spec) error {
	st := synth.Generate(spec)
	var nss []*corev1.Namespace
	for _, ns := range st.Namespaces {
		ns = ns.DeepCopy()
		nss = append(nss, ns)
	}
	if err := parallel(nss, func(ns *corev1.Namespace) error {
		_, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("namespaces: %w", err)
	}
	var pods []*corev1.Pod
	for _, p := range st.Pods.All() {
		pods = append(pods, p.APIObject())
	}
	if err := parallel(pods, func(p *corev1.Pod) error {
		obj := p.DeepCopy()
		obj.Status = corev1.PodStatus{}
		obj.Spec.Containers[0].Image = "example.invalid/app"
		created, err := c.CoreV1().Pods(p.Namespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status = p.Status
		created.Status.PodIP = p.Status.PodIPs[0].IP
		_, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("pods: %w", err)
	}
	var pols []*networkingv1.NetworkPolicy
	for _, np := range st.Policies {
		pols = append(pols, np)
	}
	if err := parallel(pols, func(np *networkingv1.NetworkPolicy) error {
		_, err := c.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np.DeepCopy(), metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	return nil
}

// BenchmarkAgentWithAPIServer starts the agent on an empty node against a real kube-apiserver
// that already holds the benchmark cluster (5,000 pods, 10,000 policies), and reports the time
// until ready, the agent's memory, and the latency from a policy create to the kernel holding it.
func BenchmarkAgentWithAPIServer(b *testing.B) {
	requireRoot(b)
	srv := kubetest.Start(b, kubetest.Options{})
	client := srv.AdminClient(b)
	srv.InstallClusterNetworkPolicyCRD(b, kubetest.CRDStandard)
	cnps := npaclient.NewForConfigOrDie(srv.AdminConfig()).PolicyV1beta1()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	spec := synth.Default()
	loadStart := time.Now()
	if err := loadCluster(ctx, client, spec); err != nil {
		b.Fatal(err)
	}
	b.Logf("cluster loaded into the API in %v", time.Since(loadStart).Round(time.Second))

	sim, err := simnode.New(simnode.Options{NodeName: spec.LocalNode,
		Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, TCPPorts: []uint16{80}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	if err := sim.ForwardFromNode(strings.TrimPrefix(srv.URL, "https://")); err != nil {
		b.Fatal(err)
	}
	var ready, createToEnforced, createCall, eventToEnforced []time.Duration
	var npSyncs []map[string]time.Duration     // the agent's own timings of the syncs the creates caused
	cnpLatency := map[string][]time.Duration{} // by event: create, priority, delete
	var rss, hwm int
	for b.Loop() {
		start := time.Now()
		if err := sim.StartAgentArgs("--kubeconfig", srv.Kubeconfig(b, ""), "--log-level", "info"); err != nil {
			b.Fatal(err)
		}
		if err := sim.WaitStatus(5*time.Minute, "ready", func(st statusapi.Status) bool { return st.Ready }); err != nil {
			b.Fatal(err)
		}
		ready = append(ready, time.Since(start))
		time.Sleep(2 * time.Second) // let the first sync's garbage be collected before reading the memory
		rss, hwm = agentMemory(b, sim)
		logFrom := len(sim.Log())
		// 40 creates: the median of fewer moves by a millisecond with what else the machine
		// runs, the API server's share included.
		for i := 0; i < 40; i++ {
			np := &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns-00002", Name: fmt.Sprintf("bench-%d-%d", len(ready), i)},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}, Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%10)}}}},
				}}},
			}
			t0 := time.Now()
			created, err := client.NetworkingV1().NetworkPolicies("ns-00002").Create(ctx, np, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			createCall = append(createCall, time.Since(t0))
			if err := sim.WaitResource(30*time.Second, "networkpolicies", cluster.ParseResourceVersion(created.ResourceVersion)); err != nil {
				b.Fatal(err)
			}
			createToEnforced = append(createToEnforced, time.Since(t0))
			// From the API server's answer, when the object is stored and its watch event
			// sent: the agent's share, with the watch's.
			eventToEnforced = append(eventToEnforced, createToEnforced[len(createToEnforced)-1]-createCall[len(createCall)-1])
		}
		for _, s := range syncTimings(b, sim.Log()[logFrom:], "msg=synced") {
			if _, ok := s["sinceEvent"]; ok { // a sync some event caused
				npSyncs = append(npSyncs, s)
			}
		}
		// ClusterNetworkPolicy events, each timed from the API call to the kernel holding it.
		for i := 0; i < 20; i++ {
			cnp := synth.ClusterPolicy(4) // an admin policy selecting local pods
			cnp.Name = fmt.Sprintf("bench-%d-%d", len(ready), i)
			t0 := time.Now()
			created, err := cnps.ClusterNetworkPolicies().Create(ctx, cnp, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			// The API server's own share (admission, the CRD's validation rules, etcd), which
			// no agent can shorten.
			cnpLatency["create-call"] = append(cnpLatency["create-call"], time.Since(t0))
			if err := sim.WaitResource(30*time.Second, kubeapi.ClusterPolicyResource, cluster.ParseResourceVersion(created.ResourceVersion)); err != nil {
				b.Fatal(err)
			}
			cnpLatency["create"] = append(cnpLatency["create"], time.Since(t0))
			created.Spec.Priority = 999
			t0 = time.Now()
			updated, err := cnps.ClusterNetworkPolicies().Update(ctx, created, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				// The agent's status patch (its Accepted condition) moved the resourceVersion
				// since the create: update the latest, timed from then.
				latest, gerr := cnps.ClusterNetworkPolicies().Get(ctx, cnp.Name, metav1.GetOptions{})
				if gerr != nil {
					b.Fatal(gerr)
				}
				latest.Spec.Priority = 999
				t0 = time.Now()
				updated, err = cnps.ClusterNetworkPolicies().Update(ctx, latest, metav1.UpdateOptions{})
			}
			if err != nil {
				b.Fatal(err)
			}
			if err := sim.WaitResource(30*time.Second, kubeapi.ClusterPolicyResource, cluster.ParseResourceVersion(updated.ResourceVersion)); err != nil {
				b.Fatal(err)
			}
			cnpLatency["priority"] = append(cnpLatency["priority"], time.Since(t0))
			t0 = time.Now()
			rv, err := kubetest.DeleteNow(ctx, cnps.RESTClient(), kubeapi.ClusterPolicyResource, "", cnp.Name)
			if err != nil {
				b.Fatal(err)
			}
			if err := sim.WaitResource(30*time.Second, kubeapi.ClusterPolicyResource, rv); err != nil {
				b.Fatal(err)
			}
			cnpLatency["delete"] = append(cnpLatency["delete"], time.Since(t0))
		}
		if err := sim.StopAgent(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ms(ready[len(ready)-1]), "ready-ms")
	b.ReportMetric(float64(rss)/1024, "rss-MiB")
	b.ReportMetric(float64(hwm)/1024, "peak-rss-MiB")
	sortDurations(createToEnforced)
	b.ReportMetric(ms(createToEnforced[len(createToEnforced)/2]), "create-to-enforced-p50-ms")
	b.ReportMetric(ms(createToEnforced[len(createToEnforced)-1]), "create-to-enforced-max-ms")
	sortDurations(createCall)
	b.ReportMetric(ms(createCall[len(createCall)/2]), "create-api-call-p50-ms") // the API server's share
	sortDurations(eventToEnforced)
	b.ReportMetric(ms(eventToEnforced[len(eventToEnforced)/2]), "event-to-enforced-p50-ms")
	b.ReportMetric(ms(eventToEnforced[len(eventToEnforced)-1]), "event-to-enforced-max-ms")
	for _, k := range []string{"sinceEvent", "compile", "apply", "guard"} {
		var d []time.Duration
		for _, s := range npSyncs {
			d = append(d, s[k])
		}
		if len(d) == 0 {
			b.Fatal("the agent logged no sync of the created policies")
		}
		sortDurations(d)
		b.ReportMetric(ms(d[len(d)/2]), "agent-"+k+"-p50-ms")
	}
	for _, ev := range []string{"create", "create-call", "priority", "delete"} {
		d := cnpLatency[ev]
		sortDurations(d)
		if ev == "create-call" {
			b.ReportMetric(ms(d[len(d)/2]), "cnp-create-api-call-p50-ms")
			continue
		}
		b.ReportMetric(ms(d[len(d)/2]), "cnp-"+ev+"-to-enforced-p50-ms")
	}
}

// syncTimings reads the durations of the agent's log lines holding msg (`msg=synced`,
// `msg="masquerade synced"`), in order: the share of each step, and sinceEvent, from the event
// reaching the agent to the end of the sync (the agent's own measure, without the API
// server's and the watch's share), where the line has them.
func syncTimings(b *testing.B, log, msg string) []map[string]time.Duration {
	var out []map[string]time.Duration
	for line := range strings.Lines(log) {
		if !strings.Contains(line, msg) {
			continue
		}
		m := map[string]time.Duration{}
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			switch k {
			case "sinceEvent", "compile", "apply", "guard":
				d, err := time.ParseDuration(v)
				if err != nil {
					b.Fatalf("%s in %q: %v", k, line, err)
				}
				m[k] = d
			}
		}
		out = append(out, m)
	}
	return out
}

func sortDurations(d []time.Duration) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j] < d[j-1]; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
}
