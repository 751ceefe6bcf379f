//go:build scale

// Package scale measures the agent at Kubernetes' own limits against a real kube-apiserver
// (`make bench-scale`, as root): 150,000 pods in 10,000 namespaces on 5,000 nodes, 10,000
// NetworkPolicies and 1,000 ClusterNetworkPolicies, 110 pods on the agent's node. Its figures
// are in docs/scale.md. It is kept out of `make bench` by its build tag: loading the cluster
// alone takes minutes.
package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/synth"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// scaleSpec is the cluster at Kubernetes' thresholds; NETWARDEN_SCALE_PODS shrinks it in
// proportion for a trial run.
func scaleSpec(b *testing.B) synth.Spec {
	s := synth.Spec{Namespaces: 10000, Pods: 150000, LocalPods: 110, Policies: 10000, ClusterPolicies: 1000,
		LocalNode: "node-0", Nodes: 5000,
		LocalCIDRv4: netip.MustParsePrefix("10.244.0.0/24"), RemoteCIDRv4: netip.MustParsePrefix("10.128.0.0/10")}
	if v := os.Getenv("NETWARDEN_SCALE_PODS"); v != "" {
		pods, err := strconv.Atoi(v)
		if err != nil || pods < 1000 {
			b.Fatalf("NETWARDEN_SCALE_PODS=%q: want a number of pods of at least 1000", v)
		}
		k := float64(pods) / float64(s.Pods)
		s.Pods, s.Namespaces, s.Nodes = pods, max(int(float64(s.Namespaces)*k), 10), max(int(float64(s.Nodes)*k), 2)
		s.Policies, s.ClusterPolicies = max(int(float64(s.Policies)*k), 10), max(int(float64(s.ClusterPolicies)*k), 2)
	}
	return s
}

// parallel runs fn over n items with workers goroutines and returns the first error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// load creates the cluster through the API as fast as the server takes it, each pod's status
// written as its kubelet would, and reports how long each kind took.
func load(ctx context.Context, b *testing.B, c kubernetes.Interface, npa npaclient.Interface, spec synth.Spec) *cluster.State {
	st := synth.Generate(spec)
	timed := func(what string, n int, fn func(i int) error) {
		start := time.Now()
		if err := parallel(n, 48, fn); err != nil {
			b.Fatalf("loading %s: %v", what, err)
		}
		d := time.Since(start)
		b.Logf("loaded %d %s in %v (%.0f/s)", n, what, d.Round(time.Millisecond), float64(n)/d.Seconds())
		b.ReportMetric(d.Seconds(), "load-"+what+"-s")
	}
	nodes := make([]string, spec.Nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i)
	}
	timed("nodes", len(nodes), func(i int) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i], Labels: map[string]string{"zone": fmt.Sprintf("zone-%d", i%3)}},
			Spec: corev1.NodeSpec{PodCIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", 128+i/256%64, i%256)}}}
		created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("172.%d.%d.%d", 16+i/65536, i/256%256, i%256)}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
	nss := slices.Collect(mapValues(st.Namespaces))
	timed("namespaces", len(nss), func(i int) error {
		_, err := c.CoreV1().Namespaces().Create(ctx, nss[i].DeepCopy(), metav1.CreateOptions{})
		return err
	})
	pods := slices.Collect(mapValues(st.Pods.Map()))
	timed("pods", len(pods), func(i int) error {
		_, err := createPod(ctx, c, pods[i])
		return err
	})
	nps := slices.Collect(mapValues(st.Policies))
	timed("networkpolicies", len(nps), func(i int) error {
		_, err := c.NetworkingV1().NetworkPolicies(nps[i].Namespace).Create(ctx, nps[i].DeepCopy(), metav1.CreateOptions{})
		return err
	})
	cnps := slices.Collect(mapValues(st.ClusterPolicies))
	timed("clusternetworkpolicies", len(cnps), func(i int) error {
		_, err := npa.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, cnps[i].DeepCopy(), metav1.CreateOptions{})
		return err
	})
	return st
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// createPod creates p and writes its status as a kubelet would; it returns the status write's
// resourceVersion.
func createPod(ctx context.Context, c kubernetes.Interface, p *cluster.Pod) (uint64, error) {
	obj := p.APIObject()
	status := obj.Status // phase, podIPs and podIP
	obj.Status = corev1.PodStatus{}
	obj.Spec.Containers[0].Image = "example.invalid/app"
	created, err := c.CoreV1().Pods(p.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return 0, err
	}
	created.Status = status
	updated, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return 0, err
	}
	return cluster.ParseResourceVersion(updated.ResourceVersion), nil
}

// needed is what the agent needs of a pod, the yardstick for the bytes it receives.
type needed struct {
	Namespace, Name, Node string
	Labels                map[string]string
	IPs                   []string
	Ports                 []corev1.ContainerPort
}

func neededBytes(p *cluster.Pod) int {
	n := needed{Namespace: p.Namespace, Name: p.Name, Node: p.NodeName, Labels: p.Labels}
	for _, ip := range p.IPs {
		n.IPs = append(n.IPs, ip.String())
	}
	for _, port := range p.Ports {
		if port.Name != "" {
			n.Ports = append(n.Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.Port, Protocol: port.Protocol})
		}
	}
	data, _ := json.Marshal(n)
	return len(data)
}

// procUsage reads a process's resident memory (KiB) and CPU time from /proc: the agent's, or
// the API server's and etcd's.
func procUsage(b *testing.B, pid int) (rss, hwm int, cpu time.Duration) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			v, _ := strconv.Atoi(f[1])
			switch f[0] {
			case "VmRSS:":
				rss = v
			case "VmHWM:":
				hwm = v
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return rss, hwm, time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// change is one write of the churn: when the API server answered it and the resourceVersion
// it made.
type change struct {
	answered time.Time
	rv       uint64
}

// BenchmarkKubernetesLimits loads the cluster, starts the agent on an empty node, and drives a
// churn of pod changes anywhere in the cluster, measuring each from outside.
func BenchmarkKubernetesLimits(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("needs root: the agent programs the kernel of a network namespace it creates")
	}
	srv := kubetest.Start(b, kubetest.Options{})
	cfg := srv.AdminConfig()
	cfg.QPS, cfg.Burst = -1, 0 // as fast as the server takes it
	c := kubernetes.NewForConfigOrDie(cfg)
	npa := npaclient.NewForConfigOrDie(cfg)
	srv.InstallClusterNetworkPolicyCRD(b, kubetest.CRDExperimental) // synth uses named ports
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
	defer cancel()
	spec := scaleSpec(b)
	loadStart := time.Now()
	st := load(ctx, b, c, npa, spec)
	b.Logf("cluster loaded in %v", time.Since(loadStart).Round(time.Second))

	sim, err := simnode.New(simnode.Options{NodeName: spec.LocalNode,
		Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, TCPPorts: []uint16{80}, UDPPorts: []uint16{}, SCTPPorts: []uint16{}}})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	if err := sim.ForwardFromNode(strings.TrimPrefix(srv.URL, "https://")); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		start := time.Now()
		args := []string{"--kubeconfig", srv.Kubeconfig(b, ""), "--log-level", "info"}
		if os.Getenv("NETWARDEN_SCALE_PROFILE") != "" {
			args = append(args, "--profiling")
		}
		// More flags for the agent, to measure what one changes (e.g. --resync-period=1h).
		args = append(args, strings.Fields(os.Getenv("NETWARDEN_SCALE_AGENT_ARGS"))...)
		if err := sim.StartAgentArgs(args...); err != nil {
			b.Fatal(err)
		}
		if err := sim.WaitStatus(10*time.Minute, "ready", func(s statusapi.Status) bool { return s.Ready }); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(ms(time.Since(start)), "cold-start-ms")
		// Where the cold start went: the agent's lines up to ready carry their times.
		for line := range strings.Lines(sim.Log()) {
			for _, msg := range []string{`msg="waiting for kubernetes caches`, `msg="kubernetes caches synced"`, `msg=synced `, `msg=ready`} {
				if strings.Contains(line, msg) {
					b.Logf("agent: %s", strings.TrimSpace(line))
				}
			}
			if strings.Contains(line, "msg=ready") {
				break
			}
		}
		startDown, _ := sim.ForwardedBytes()
		b.ReportMetric(float64(startDown)/(1<<20), "start-received-MiB")
		time.Sleep(5 * time.Second) // the first sync's garbage collected
		rss, hwm, _ := procUsage(b, sim.AgentPID())
		if path := os.Getenv("NETWARDEN_SCALE_PROFILE"); path != "" {
			fetchProfile(b, sim, "heap", path+".heap")
		}
		b.ReportMetric(float64(rss)/1024, "rss-MiB")
		b.ReportMetric(float64(hwm)/1024, "peak-rss-MiB")

		churn(ctx, b, c, sim, st, srv)
		if err := sim.StopAgent(); err != nil {
			b.Fatal(err)
		}
	}
}

// churn changes pods anywhere in the cluster at 100 a second for a minute (relabels, creates
// and deletes in turn) and reports the latency from the API server's answer to the agent's
// /status covering the change, the agent's CPU, and the bytes it received per change. It also
// reports the CPU of kube-apiserver and etcd, which share the machine's cores with the agent
// and the churn's client, and whose share of the latency is the rest of it.
func churn(ctx context.Context, b *testing.B, c kubernetes.Interface, sim *simnode.Sim, st *cluster.State, srv *kubetest.Server) {
	const rate, duration = 100, time.Minute
	var keys []string
	for k, p := range st.Pods.All() {
		if p.NodeName != sim.NodeName {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	r := rand.New(rand.NewPCG(1, 2))

	// Covered changes, read by long polls of /status as the agent makes them.
	var mu sync.Mutex
	var pending []change
	var latencies []time.Duration
	done := make(chan struct{})
	pollCtx, stopPolls := context.WithCancel(ctx)
	client := statusapi.UnixClient(sim.StatusSocket())
	go func() {
		defer close(done)
		var version uint64
		for pollCtx.Err() == nil {
			s, err := client.ReadChanged(statusapi.Query{Resources: []string{"pods"}}, version, time.Second)
			now := time.Now()
			if err != nil {
				continue
			}
			version = s.Version
			mu.Lock()
			kept := pending[:0]
			for _, ch := range pending {
				if statusapi.CoversResource(s, "pods", ch.rv) {
					latencies = append(latencies, now.Sub(ch.answered))
				} else {
					kept = append(kept, ch)
				}
			}
			pending = kept
			mu.Unlock()
		}
	}()

	if path := os.Getenv("NETWARDEN_SCALE_PROFILE"); path != "" {
		// The agent's CPU profile of 30 s of the churn, for `go tool pprof`.
		go fetchProfile(b, sim, "profile?seconds=30", path)
	}
	logFrom := len(sim.Log())
	pid := sim.AgentPID()
	_, _, cpu0 := procUsage(b, pid)
	apiPID, etcdPID := srv.PIDs()
	_, _, apiCPU0 := procUsage(b, apiPID)
	_, _, etcdCPU0 := procUsage(b, etcdPID)
	down0, _ := sim.ForwardedBytes()
	var neededTotal, changes int
	var created []*cluster.Pod
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	start := time.Now()
	var sem = make(chan struct{}, 16)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for i := 0; time.Since(start) < duration; i++ {
		<-tick.C
		var do func() (uint64, error)
		kind := i % 3
		if kind == 2 && len(created) <= rate/2 {
			kind = 0 // no pod the churn created half a second ago yet: relabel instead
		}
		switch kind {
		case 0: // relabel a pod
			k := keys[r.IntN(len(keys))]
			p := st.Pods.Get(k)
			patch := fmt.Sprintf(`{"metadata":{"labels":{"app":"app-%d"}}}`, r.IntN(10))
			neededTotal += neededBytes(p)
			do = func() (uint64, error) {
				out, err := c.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
				if err != nil {
					return 0, err
				}
				return cluster.ParseResourceVersion(out.ResourceVersion), nil
			}
		case 1: // create a pod
			src := st.Pods.Get(keys[r.IntN(len(keys))])
			cp := *src // a copy: src is the state's
			p := &cp
			p.Name = fmt.Sprintf("churn-%06d", i)
			p.ResourceVersion = ""
			p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}
			created = append(created, p)
			neededTotal += neededBytes(p)
			do = func() (uint64, error) { return createPod(ctx, c, p) }
		default: // delete a pod the churn created half a second or more ago
			p := created[0]
			created = created[1:]
			neededTotal += neededBytes(p)
			do = func() (uint64, error) { return kubetest.DeletePodNow(ctx, c, p.Namespace, p.Name) }
		}
		changes++
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rv, err := do()
			answered := time.Now()
			if err != nil {
				failed.Store(&err)
				return
			}
			mu.Lock()
			pending = append(pending, change{answered: answered, rv: rv})
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatalf("churn: %v", *err)
	}
	wall := time.Since(start)
	_, _, cpu1 := procUsage(b, pid)
	_, _, apiCPU1 := procUsage(b, apiPID)
	_, _, etcdCPU1 := procUsage(b, etcdPID)
	down1, _ := sim.ForwardedBytes()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		left := len(pending)
		mu.Unlock()
		if left == 0 || time.Now().After(deadline) {
			if left > 0 {
				b.Fatalf("%d of %d changes not covered 30 s after the churn", left, changes)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopPolls()
	<-done
	slices.Sort(latencies)
	b.ReportMetric(float64(changes)/wall.Seconds(), "churn-changes/s")
	b.ReportMetric(ms(latencies[len(latencies)/2]), "change-to-kernel-p50-ms")
	b.ReportMetric(ms(latencies[len(latencies)*99/100]), "change-to-kernel-p99-ms")
	b.ReportMetric((cpu1-cpu0).Seconds()/wall.Seconds(), "churn-cpu-cores")
	b.ReportMetric((apiCPU1-apiCPU0).Seconds()/wall.Seconds(), "churn-apiserver-cpu-cores")
	b.ReportMetric((etcdCPU1-etcdCPU0).Seconds()/wall.Seconds(), "churn-etcd-cpu-cores")
	// The agent's own share, from the event reaching it to the end of the sync (its synced
	// lines): what remains of the latency is the API server's and the watch's.
	steps := map[string][]time.Duration{}
	for line := range strings.Lines(sim.Log()[logFrom:]) {
		if !strings.Contains(line, "msg=synced") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok && (k == "sinceEvent" || k == "compile" || k == "apply") {
				if d, err := time.ParseDuration(v); err == nil {
					steps[k] = append(steps[k], d)
				}
			}
		}
	}
	for _, k := range []string{"sinceEvent", "compile", "apply"} {
		if d := steps[k]; len(d) > 0 {
			slices.Sort(d)
			b.ReportMetric(ms(d[len(d)/2]), "agent-"+k+"-p50-ms")
			if k == "sinceEvent" {
				b.ReportMetric(ms(d[len(d)*99/100]), "agent-"+k+"-p99-ms")
				b.ReportMetric(float64(len(d))/wall.Seconds(), "syncs/s")
			}
		}
	}
	b.ReportMetric(float64(down1-down0)/float64(changes), "received-bytes/change")
	b.ReportMetric(float64(neededTotal)/float64(changes), "needed-bytes/change")
	rss, hwm, _ := procUsage(b, pid)
	b.ReportMetric(float64(rss)/1024, "churn-rss-MiB")
	b.ReportMetric(float64(hwm)/1024, "churn-peak-rss-MiB")
}

// fetchProfile saves the agent's pprof profile (a path under /debug/pprof/) to file.
func fetchProfile(b *testing.B, sim *simnode.Sim, profile, file string) {
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sim.StatusSocket())
	}}}
	resp, err := hc.Get("http://agent/debug/pprof/" + profile)
	if err != nil {
		b.Logf("profile %s: %v", profile, err)
		return
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		b.Logf("profile %s: %v", profile, err)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
