package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/source/manifests"
	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// requireKernel skips outside CI when the test cannot run here, and fails in CI, where a
// skipped kernel test would hide a regression.
func requireKernel(t *testing.T) { kerneltest.RequireAgent(t, simnode.AgentBinary) }

// world is the cluster a test bed simulates: namespaces, pods (local ones backed by network
// namespaces) and policies.
type world struct {
	sim        *simnode.Sim
	namespaces map[string]*corev1.Namespace
	pods       map[string]*corev1.Pod
	tpods      map[string]*testbed.Pod
	policies   map[string]*networkingv1.NetworkPolicy
	nodes      map[string]*corev1.Node
	agents     []*nodeAgent // agents on extra nodes
	be         backend      // the NetworkPolicy backend every agent of this world uses
}

func newWorld(t *testing.T, be backend, topo testbed.Topology, v4, v6 bool) *world {
	t.Helper()
	requireKernel(t)
	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{Topology: topo, IPv4: v4, IPv6: v6}, AgentBin: agentBinary(t, be)})
	if err != nil {
		t.Fatalf("creating test bed: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", tail(sim.Log(), 60))
			t.Logf("kernel state (%s):\n%s", be.name, tail(kernelState(context.Background(), sim.Bed, be), 200))
		}
		if err := sim.Close(); err != nil {
			t.Errorf("closing test bed: %v", err)
		}
	})
	// The agent's own Node, with its podCIDRs, as in a real cluster: masquerade (on by default)
	// keeps pod-to-pod traffic between the podCIDRs of all Nodes unmasqueraded.
	local := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: sim.NodeName}}
	for _, p := range []netip.Prefix{sim.Bed.Config().PodCIDRv4, sim.Bed.Config().PodCIDRv6} {
		if p.IsValid() {
			local.Spec.PodCIDRs = append(local.Spec.PodCIDRs, p.String())
		}
	}
	return &world{sim: sim, namespaces: map[string]*corev1.Namespace{}, pods: map[string]*corev1.Pod{},
		tpods: map[string]*testbed.Pod{}, policies: map[string]*networkingv1.NetworkPolicy{}, nodes: map[string]*corev1.Node{sim.NodeName: local},
		be: be}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (w *world) addNamespace(name string, labels map[string]string) {
	w.namespaces[name] = simnode.Namespace(name, labels)
}

func (w *world) addPod(t *testing.T, ns, name string, labels map[string]string, ports ...corev1.ContainerPort) {
	t.Helper()
	p, tp, err := w.sim.AddPod(ns, name, labels, ports...)
	if err != nil {
		t.Fatalf("adding pod %s/%s: %v", ns, name, err)
	}
	w.pods[cluster.Key(ns, name)] = p
	w.tpods[cluster.Key(ns, name)] = tp
}

// addRemotePod adds a pod on another simulated node, where no agent runs: it is only ever a
// peer of the local pods, and its traffic crosses the local node's forward hook.
func (w *world) addRemotePod(t *testing.T, ns, name string, labels map[string]string, ports ...corev1.ContainerPort) {
	t.Helper()
	w.addPodOn(t, "node-2", ns, name, labels, ports...)
}

// addPodOn adds a pod on the simulated node nodeName, creating that node on first use.
func (w *world) addPodOn(t *testing.T, nodeName, ns, name string, labels map[string]string, ports ...corev1.ContainerPort) {
	t.Helper()
	node := w.node(t, nodeName)
	tp, err := node.AddPod(ns, name)
	if err != nil {
		t.Fatalf("adding pod %s/%s on %s: %v", ns, name, nodeName, err)
	}
	w.pods[cluster.Key(ns, name)] = simnode.PodObject(ns, name, nodeName, labels, tp.IPs(), ports...)
	w.tpods[cluster.Key(ns, name)] = tp
}

func (w *world) node(t *testing.T, name string) *testbed.Node {
	t.Helper()
	node := w.sim.Bed.Node(name)
	if node == nil {
		var err error
		if node, err = w.sim.Bed.AddNode(name); err != nil {
			t.Fatalf("adding node %s: %v", name, err)
		}
		n := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, p := range []netip.Prefix{node.PodCIDRv4, node.PodCIDRv6} {
			if p.IsValid() {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.String())
			}
		}
		w.nodes[name] = n
	}
	return node
}

// isRemote reports whether a pod is on a node where no agent judges its traffic.
func (w *world) isRemote(ep endpoint) bool {
	if ep.pod == nil || ep.pod.Spec.NodeName == w.sim.NodeName {
		return false
	}
	for _, a := range w.agents {
		if a.nodeName == ep.pod.Spec.NodeName {
			return false
		}
	}
	return true
}

func (w *world) removePod(t *testing.T, key string) {
	t.Helper()
	if err := w.sim.Bed.RemovePod(w.tpods[key]); err != nil {
		t.Fatal(err)
	}
	delete(w.pods, key)
	delete(w.tpods, key)
}

func (w *world) objects() []runtime.Object {
	var objs []runtime.Object
	for _, k := range sortedKeys(w.namespaces) {
		objs = append(objs, w.namespaces[k])
	}
	for _, k := range sortedKeys(w.nodes) {
		objs = append(objs, w.nodes[k])
	}
	for _, k := range sortedKeys(w.pods) {
		objs = append(objs, w.pods[k])
	}
	for _, k := range sortedKeys(w.policies) {
		objs = append(objs, w.policies[k])
	}
	return objs
}

// apply writes the world to the manifests directory and waits for every agent to have applied
// it, as each one's status reports.
func (w *world) apply(t *testing.T) {
	t.Helper()
	if err := w.sim.Apply(w.objects()...); err != nil {
		t.Fatal(err)
	}
	for _, a := range w.agents {
		a.waitApplied(t, w.sim.Written())
	}
	if err := w.sim.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	for _, a := range w.agents {
		if out, err := exec.Command("ip", "netns", "exec", a.node.NetNSName, "conntrack", "-F").CombinedOutput(); err != nil {
			t.Fatalf("conntrack -F on %s: %v %s", a.nodeName, err, out)
		}
	}
}

// nodeAgent is the agent binary running in an extra node's netns on the same manifests.
type nodeAgent struct {
	nodeName string
	node     *testbed.Node
	sock     string // the unix socket of its health server, for its status
	cmd      *exec.Cmd
	mu       sync.Mutex
	log      bytes.Buffer
}

func (a *nodeAgent) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.Write(p)
}

// waitApplied waits until the agent's status says it has applied the given file contents.
func (a *nodeAgent) waitApplied(t *testing.T, files map[string]string) {
	t.Helper()
	names := slices.Collect(maps.Keys(files))
	var last statusapi.Status
	waitFor(t, 15*time.Second, "agent on "+a.nodeName+" applied the manifests", func() bool {
		st, err := statusapi.UnixClient(a.sock).Read(statusapi.Query{Files: names})
		last = st
		return err == nil && statusapi.Covers(st, files)
	})
	_ = last
}

// startAgentOn runs an agent for node name in that node's netns.
func (w *world) startAgentOn(t *testing.T, name string) {
	t.Helper()
	node := w.node(t, name)
	a := startAgentIn(t, agentBinary(t, w.be), node.NetNSName, name, w.sim.Dir)
	a.node = node
	w.agents = append(w.agents, a)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// endpoint is a probe source or destination: a pod, or the node itself (pod nil).
type endpoint struct {
	key string // "ns/name", or "node"
	pod *corev1.Pod
}

var (
	probePorts  = []uint16{80, 81}
	probeProtos = []testbed.Protocol{testbed.TCP, testbed.UDP, testbed.SCTP}
)

type probeCase struct {
	probe    testbed.Probe
	src, dst endpoint
	want     bool
}

// cases lists every probe of the reachability matrix with the oracle's verdict: each pod to
// every other pod and to the node, and the node to each pod, for every family both ends have,
// port and protocol.
func (w *world) cases(oracle *oracle) []probeCase {
	var out []probeCase
	eps := []endpoint{{key: "node"}}
	for _, k := range sortedKeys(w.pods) {
		eps = append(eps, endpoint{key: k, pod: w.pods[k]})
	}
	for _, src := range eps {
		for _, dst := range eps {
			if src.key == dst.key {
				continue // a pod's traffic to itself never leaves its namespace
			}
			if (w.isRemote(src) || src.pod == nil) && (w.isRemote(dst) || dst.pod == nil) {
				continue // never crosses this node's forward path
			}
			var dstIPs []netip.Addr
			if dst.pod == nil {
				dstIPs = w.sim.Bed.NodeIPs()
			} else {
				dstIPs = w.tpods[dst.key].IPs()
			}
			for _, dip := range dstIPs {
				var srcIP netip.Addr
				var srcPod *testbed.Pod
				if src.pod != nil {
					srcPod = w.tpods[src.key]
					for _, ip := range srcPod.IPs() {
						if ip.Is4() == dip.Is4() {
							srcIP = ip
						}
					}
					if !srcIP.IsValid() {
						continue
					}
				}
				for _, port := range probePorts {
					for _, proto := range probeProtos {
						pc := probeCase{
							probe: testbed.Probe{Src: srcPod, Dst: dip, Port: port, Protocol: proto},
							src:   src, dst: dst,
						}
						pc.want = w.expect(oracle, src, dst, srcIP, dip, port, proto)
						out = append(out, pc)
					}
				}
			}
		}
	}
	return out
}

func (w *world) peer(ep endpoint, ip netip.Addr, notInKeys map[string]bool) *matcher.TrafficPeer {
	if ep.pod == nil || !eligible(ep.pod) {
		// The node, and pods that are finished or on the host network, are no pods to
		// NetworkPolicy: only their IP can match (an ipBlock).
		return &matcher.TrafficPeer{IP: ip.String()}
	}
	nsLabels := map[string]string{cluster.NamespaceNameLabel: ep.pod.Namespace}
	if ns, ok := w.namespaces[ep.pod.Namespace]; ok {
		for k, v := range ns.Labels {
			nsLabels[k] = v
		}
	}
	return &matcher.TrafficPeer{IP: ip.String(), Internal: &matcher.InternalPeer{
		PodLabels:       withAbsentKeys(ep.pod.Labels, notInKeys),
		NamespaceLabels: withAbsentKeys(nsLabels, notInKeys),
		Namespace:       ep.pod.Namespace,
	}}
}

// eligible reports whether a pod of the world takes part in policy, as the agent keeps it: the
// world models pods as the API objects it writes out, converted here at the boundary.
func eligible(p *corev1.Pod) bool { return len(policy.EligibleIPs(cluster.PodOf(p))) > 0 }

// cyclonus v0.5.6 deviates from Kubernetes on one point: its NotIn does not match an object
// that lacks the key, while apimachinery's labels.Selector (what the API server, kubectl and
// every policy implementation use) does. The oracle is corrected without touching its code:
// for each key used by a NotIn, objects lacking it get the absentValue, and Exists and
// DoesNotExist on such keys are rewritten to NotIn/In on absentValue. Every other operator
// then evaluates exactly as before.
const absentValue = "__absent__"

func withAbsentKeys(labels map[string]string, keys map[string]bool) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		out[k] = v
	}
	for k := range keys {
		if _, ok := out[k]; !ok {
			out[k] = absentValue
		}
	}
	return out
}

func selectorsOf(np *networkingv1.NetworkPolicy) []*metav1.LabelSelector {
	out := []*metav1.LabelSelector{&np.Spec.PodSelector}
	add := func(peers []networkingv1.NetworkPolicyPeer) {
		for i := range peers {
			if peers[i].PodSelector != nil {
				out = append(out, peers[i].PodSelector)
			}
			if peers[i].NamespaceSelector != nil {
				out = append(out, peers[i].NamespaceSelector)
			}
		}
	}
	for _, r := range np.Spec.Ingress {
		add(r.From)
	}
	for _, r := range np.Spec.Egress {
		add(r.To)
	}
	return out
}

func notInKeys(nps []*networkingv1.NetworkPolicy) map[string]bool {
	keys := map[string]bool{}
	for _, np := range nps {
		for _, s := range selectorsOf(np) {
			for _, e := range s.MatchExpressions {
				if e.Operator == metav1.LabelSelectorOpNotIn {
					keys[e.Key] = true
				}
			}
		}
	}
	return keys
}

func rewriteForAbsentKeys(np *networkingv1.NetworkPolicy, keys map[string]bool) {
	for _, s := range selectorsOf(np) {
		for i, e := range s.MatchExpressions {
			if !keys[e.Key] {
				continue
			}
			switch e.Operator {
			case metav1.LabelSelectorOpExists:
				s.MatchExpressions[i] = metav1.LabelSelectorRequirement{Key: e.Key, Operator: metav1.LabelSelectorOpNotIn, Values: []string{absentValue}}
			case metav1.LabelSelectorOpDoesNotExist:
				s.MatchExpressions[i] = metav1.LabelSelectorRequirement{Key: e.Key, Operator: metav1.LabelSelectorOpIn, Values: []string{absentValue}}
			}
		}
	}
}

func (w *world) expect(oracle *oracle, src, dst endpoint, srcIP, dstIP netip.Addr, port uint16, proto testbed.Protocol) bool {
	if src.pod == nil {
		if dst.pod == nil || dst.pod.Spec.NodeName == w.sim.NodeName || w.isRemote(dst) {
			return true // the node may always reach its own pods
		}
		// To another node's pods, this node is just an outside address: the node IP the
		// test bed binds node probes to.
		for _, ip := range w.sim.Bed.NodeIPs() {
			if ip.Is4() == dstIP.Is4() {
				srcIP = ip
			}
		}
	}
	portName := ""
	if dst.pod != nil {
		for _, c := range dst.pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.ContainerPort == int32(port) && string(cp.Protocol) == string(proto) {
					portName = cp.Name
				}
			}
		}
	}
	tr := &matcher.Traffic{
		Source:           w.peer(src, srcIP, oracle.notInKeys),
		Destination:      w.peer(dst, dstIP, oracle.notInKeys),
		ResolvedPort:     int(port),
		ResolvedPortName: portName,
		Protocol:         corev1.Protocol(proto),
	}
	// Only this node runs an agent: it enforces the egress of its own pods and the ingress
	// to them, never a remote pod's side.
	switch {
	case w.isRemote(src):
		return oracle.policy.IsIngressOrEgressAllowed(tr, true).IsAllowed()
	case w.isRemote(dst):
		return oracle.policy.IsIngressOrEgressAllowed(tr, false).IsAllowed()
	}
	return oracle.policy.IsTrafficAllowed(tr).IsAllowed()
}

type oracle struct {
	policy    *matcher.Policy
	notInKeys map[string]bool
}

// buildOracle feeds cyclonus the policies after the API server's defaulting, without which
// its BuildTarget panics on empty policyTypes.
func (w *world) buildOracle() *oracle {
	var nps []*networkingv1.NetworkPolicy
	for _, k := range sortedKeys(w.policies) {
		np := w.policies[k].DeepCopy()
		cluster.DefaultNetworkPolicy(np)
		nps = append(nps, np)
	}
	keys := notInKeys(nps)
	for _, np := range nps {
		rewriteForAbsentKeys(np, keys)
	}
	return &oracle{policy: matcher.BuildNetworkPolicies(false, nps), notInKeys: keys}
}

// check probes the whole matrix and compares it with the oracle.
func (w *world) check(t *testing.T, step string) {
	t.Helper()
	cases := w.cases(w.buildOracle())
	w.checkModel(t, step, cases)
	probes := make([]testbed.Probe, len(cases))
	for i, c := range cases {
		probes[i] = c.probe
	}
	got := w.sim.Bed.ProbeAll(context.Background(), probes)
	// A probe that lost a packet to a busy machine reports "blocked" for an allowed flow: those
	// are probed again (and logged when only transient) before judging. A flow probed allowed
	// that the oracle blocks is never a lost packet: the rules in the kernel let it through,
	// so it is judged at once.
	wrongOpen := map[int]bool{}
	for i, c := range cases {
		if got[i] && !c.want {
			wrongOpen[i] = true
		}
	}
	for attempt := 0; attempt < 2; attempt++ {
		var again []int
		for i, c := range cases {
			if got[i] != c.want && !wrongOpen[i] {
				again = append(again, i)
			}
		}
		if len(again) == 0 {
			break
		}
		retry := make([]testbed.Probe, len(again))
		for j, i := range again {
			retry[j] = probes[i]
			if attempt == 1 {
				retry[j].Timeout = lastTryTimeout
			}
		}
		res := w.sim.Bed.ProbeAll(context.Background(), retry)
		for j, i := range again {
			if res[j] == cases[i].want {
				t.Logf("%s: %s was transient (probed %s once, then %s)", step, probes[i], verdict(got[i]), verdict(res[j]))
			}
			got[i] = res[j]
			wrongOpen[i] = res[j] && !cases[i].want
		}
	}
	var wrong []string
	allowed := 0
	for i, c := range cases {
		if got[i] {
			allowed++
		}
		if got[i] != c.want {
			wrong = append(wrong, fmt.Sprintf("  %s -> %s (%s) %s/%d: probed %s, oracle says %s",
				c.src.key, c.dst.key, c.probe.Dst, c.probe.Protocol, c.probe.Port, verdict(got[i]), verdict(c.want)))
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		if len(wrong) > 40 {
			wrong = append(wrong[:40], fmt.Sprintf("  ... and %d more", len(wrong)-40))
		}
		t.Fatalf("%s: %d of %d probes differ from the oracle:\n%s\npolicies:\n%s", step, len(wrong), len(cases),
			strings.Join(wrong, "\n"), w.policyYAML())
	}
	t.Logf("%s: %d probes match the oracle (%d allowed, %d blocked)", step, len(cases), allowed, len(cases)-allowed)
}

// checkModel holds the policy model, as `netwarden explain` judges with it, against the oracle
// for every case between two pods: the Ruleset of each node that runs an agent judges the
// egress of its pods and the ingress to them, as the kernel does; pods on nodes without an
// agent are judged by nobody.
func (w *world) checkModel(t *testing.T, step string, cases []probeCase) {
	t.Helper()
	dir := t.TempDir()
	data, err := simnode.Marshal(w.objects()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	st, errs := manifests.Load(dir, nil)
	if len(errs) > 0 {
		t.Fatalf("%s: the world as manifests: %v", step, errs)
	}
	// Each node with an agent judges the egress of its pods and the ingress to them.
	rulesets := map[string]*policy.Ruleset{}
	for _, node := range append([]string{w.sim.NodeName}, agentNodes(w)...) {
		rulesets[node], _ = policy.Compile(st, node)
	}
	var wrong []string
	judged := 0
	for _, c := range cases {
		if c.src.pod == nil || c.dst.pod == nil || !eligible(c.src.pod) || !eligible(c.dst.pod) {
			continue
		}
		srcIP := c.probe.Src.IP(familyOf(c.probe.Dst))
		proto := policy.Protocol(strings.ToLower(string(c.probe.Protocol)))
		egress, ingress := true, true
		if rs := rulesets[c.src.pod.Spec.NodeName]; rs != nil {
			egress = rs.Judge(policy.Egress, srcIP, c.probe.Dst, proto, c.probe.Port).Allowed
		}
		if rs := rulesets[c.dst.pod.Spec.NodeName]; rs != nil {
			ingress = rs.Judge(policy.Ingress, c.probe.Dst, srcIP, proto, c.probe.Port).Allowed
		}
		judged++
		if got := egress && ingress; got != c.want {
			wrong = append(wrong, fmt.Sprintf("  %s -> %s (%s) %s/%d: the model says %s (egress %v, ingress %v), the oracle %s",
				c.src.key, c.dst.key, c.probe.Dst, c.probe.Protocol, c.probe.Port, verdict(got), egress, ingress, verdict(c.want)))
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		t.Errorf("%s: the policy model (netwarden explain) disagrees with the oracle on %d of %d cases:\n%s", step, len(wrong), judged, strings.Join(wrong, "\n"))
	}
}

func agentNodes(w *world) []string {
	var names []string
	for _, a := range w.agents {
		names = append(names, a.nodeName)
	}
	return names
}

func familyOf(ip netip.Addr) int {
	if ip.Is4() {
		return 4
	}
	return 6
}

func verdict(b bool) string {
	if b {
		return "allowed"
	}
	return "blocked"
}

func (w *world) policyYAML() string {
	var objs []runtime.Object
	for _, k := range sortedKeys(w.policies) {
		objs = append(objs, w.policies[k])
	}
	b, _ := simnode.Marshal(objs...)
	return string(b)
}

func simnodeMarshal(objs []runtime.Object) ([]byte, error) { return simnode.Marshal(objs...) }

// requireIncremental fails if any incremental sync fell back to replacing the table, which
// would hide a bug in the incremental (netlink) path behind a working full sync.
func (w *world) requireIncremental(t *testing.T) {
	t.Helper()
	if !strings.Contains(w.sim.Log(), "backend="+w.be.name) {
		t.Errorf("the agent did not run on backend %s:\n%s", w.be.name, tail(w.sim.Log(), 20))
	}
	for _, line := range strings.Split(w.sim.Log(), "\n") {
		if strings.Contains(line, "fallbackReason") {
			t.Errorf("an incremental sync fell back to a full one: %s", line)
		}
	}
}
