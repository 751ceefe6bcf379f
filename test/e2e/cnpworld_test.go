package e2e

// The kernel side of the ClusterNetworkPolicy tests: a two-node test bed (an agent on each node,
// so both ends of every connection are judged: egress at the source's node, ingress at the
// destination's), dual-stack pods with servers on every port probed, the cluster written as
// manifests (cluster.yaml for namespaces, nodes and pods; one file for the policies), and
// probes compared with the oracle.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/statusapi"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

const (
	cnpClusterFile = "cluster.yaml"
	// cnpProbeConcurrency: every probe of a step runs at once, so a step whose denied probes
	// time out costs one probe timeout, however many they are.
	cnpProbeConcurrency = 1024
)

// cnpWorld is a two-node cluster in a test bed, its API objects in c.
type cnpWorld struct {
	sim     *simnode.Sim
	be      backend
	c       *cnpCluster
	tpods   map[string]*testbed.Pod  // pods backed by network namespaces, by "ns/name"
	tnodes  map[string]*testbed.Node // by Node name
	agents  []*nodeAgent             // the agents of the nodes other than the sim's own
	written map[string][]byte        // the last content written to each file
}

// newCNPBed creates the bed (dual-stack, servers on the given ports) with a second node, and the
// Node objects: node-1 (the sim's node) lists its underlay addresses as InternalIP and the
// addresses facing its pods as ExternalIP; node-2 lists its underlay addresses only, so its
// pod-facing addresses are addresses of no Node.
func newCNPBed(t *testing.T, be backend, topo testbed.Topology, tcpPorts, udpPorts, sctpPorts []uint16) *cnpWorld {
	t.Helper()
	requireKernel(t)
	sim, err := simnode.New(simnode.Options{Bed: testbed.Config{Topology: topo, IPv4: true, IPv6: true,
		TCPPorts: tcpPorts, UDPPorts: udpPorts, SCTPPorts: sctpPorts}, AgentBin: agentBinary(t, be)})
	if err != nil {
		t.Fatalf("creating test bed: %v", err)
	}
	w := &cnpWorld{sim: sim, be: be, c: newCNPCluster(), tpods: map[string]*testbed.Pod{},
		tnodes: map[string]*testbed.Node{}, written: map[string][]byte{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log (node-1):\n%s", tail(sim.Log(), 40))
			t.Logf("kernel state of node-1 (%s):\n%s", be.name, tail(kernelState(context.Background(), sim.Bed, be), 150))
		}
		if err := sim.Close(); err != nil {
			t.Errorf("closing test bed: %v", err)
		}
	})
	sim.Bed.Concurrency = cnpProbeConcurrency
	n2, err := sim.Bed.AddNode("node-2")
	if err != nil {
		t.Fatalf("adding node-2: %v", err)
	}
	local := sim.Bed.LocalNode()
	w.tnodes[sim.NodeName] = local
	w.tnodes["node-2"] = n2
	cidrs := func(n *testbed.Node) []netip.Prefix { return []netip.Prefix{n.PodCIDRv4, n.PodCIDRv6} }
	w.c.Nodes[sim.NodeName] = confNode(sim.NodeName, cidrs(local), local.UnderlayIPs(), local.NodeIPs())
	w.c.Nodes["node-2"] = confNode("node-2", cidrs(n2), n2.UnderlayIPs(), nil)
	return w
}

// place creates a pod on a node (a network namespace; for a host network pod nothing, its
// addresses being its node's InternalIPs) and returns its addresses.
func (w *cnpWorld) place(ns, name, node string, hostNetwork bool) ([]netip.Addr, error) {
	tn := w.tnodes[node]
	if tn == nil {
		return nil, fmt.Errorf("no node %s", node)
	}
	if hostNetwork {
		return tn.UnderlayIPs(), nil
	}
	tp, err := tn.AddPod(ns, name)
	if err != nil {
		return nil, err
	}
	w.tpods[ns+"/"+name] = tp
	return tp.IPs(), nil
}

// start writes the cluster and runs an agent on each node, and waits for both to apply it.
//
// The node network (the underlay) is exempt from masquerade, as a cluster's node network is: with
// the defaults, the agent masquerades IPv6 from pods to another node's underlay address, and
// under load some of those SCTP INITs were lost or their sender's write timed out (seen with no
// policy at all; never with the exemption), which is masquerade's business, not these tests'.
func (w *cnpWorld) start(t *testing.T) {
	t.Helper()
	var flags []string
	for _, ip := range w.sim.Bed.LocalNode().UnderlayIPs() {
		bits := 24
		if ip.Is6() {
			bits = 64
		}
		flags = append(flags, "--no-masquerade-cidr", netip.PrefixFrom(ip, bits).Masked().String())
	}
	if err := w.sim.StartAgent(flags...); err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(w.tnodes) {
		if name == w.sim.NodeName {
			continue
		}
		w.agents = append(w.agents, startCNPAgent(t, agentBinary(t, w.be), w.tnodes[name], name, w.sim.Dir, flags))
	}
	w.write(t, cnpClusterFile, w.clusterYAML(t))
	w.wait(t)
}

// startCNPAgent runs an agent for node name in its netns on the manifests directory dir.
func startCNPAgent(t *testing.T, bin string, node *testbed.Node, name, dir string, flags []string) *nodeAgent {
	t.Helper()
	a := &nodeAgent{nodeName: name, node: node, sock: filepath.Join(t.TempDir(), "agent.sock")}
	args := append([]string{"netns", "exec", node.NetNSName, bin, "agent", "--manifests", dir,
		"--node-name", name, "--health-addr", "unix:" + a.sock, "--log-level", "debug"}, flags...)
	a.cmd = exec.Command("ip", args...)
	a.cmd.Stdout, a.cmd.Stderr = a, a
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		_ = a.cmd.Wait()
		if t.Failed() {
			a.mu.Lock()
			t.Logf("agent on %s:\n%s", name, tail(a.log.String(), 40))
			a.mu.Unlock()
		}
	})
	return a
}

func (w *cnpWorld) clusterYAML(t *testing.T) []byte {
	t.Helper()
	var objs []runtime.Object
	for _, k := range sortedKeys(w.c.Namespaces) {
		objs = append(objs, w.c.Namespaces[k])
	}
	for _, k := range sortedKeys(w.c.Nodes) {
		objs = append(objs, w.c.Nodes[k])
	}
	for _, k := range sortedKeys(w.c.Pods) {
		objs = append(objs, w.c.Pods[k])
	}
	data, err := cnpMarshal(objs)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// policyYAML renders the policies of the cluster: ClusterNetworkPolicies, then NetworkPolicies.
func (w *cnpWorld) policyYAML(t *testing.T) []byte {
	t.Helper()
	var objs []runtime.Object
	for _, k := range sortedKeys(w.c.CNPs) {
		cnp := w.c.CNPs[k].DeepCopy()
		cnp.APIVersion, cnp.Kind = "policy.networking.k8s.io/v1beta1", "ClusterNetworkPolicy"
		objs = append(objs, cnp)
	}
	for _, k := range sortedKeys(w.c.NPs) {
		np := w.c.NPs[k].DeepCopy()
		np.APIVersion, np.Kind = "networking.k8s.io/v1", "NetworkPolicy"
		objs = append(objs, np)
	}
	data, err := cnpMarshal(objs)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// cnpMarshal renders objects as a multi-document YAML stream, without what the API server
// owns (status of a ClusterNetworkPolicy, creationTimestamp).
func cnpMarshal(objs []runtime.Object) ([]byte, error) {
	var sb strings.Builder
	for i, o := range objs {
		j, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(j, &m); err != nil {
			return nil, err
		}
		if m["kind"] == "ClusterNetworkPolicy" {
			delete(m, "status")
		}
		if md, ok := m["metadata"].(map[string]any); ok {
			delete(md, "creationTimestamp")
		}
		y, err := yaml.Marshal(m)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			sb.WriteString("---\n")
		}
		sb.Write(y)
	}
	return []byte(sb.String()), nil
}

// write replaces a manifest file, when its content changes.
func (w *cnpWorld) write(t *testing.T, name string, data []byte) {
	t.Helper()
	if old, ok := w.written[name]; ok && string(old) == string(data) {
		return
	}
	if err := w.sim.WriteFile(name, data); err != nil {
		t.Fatal(err)
	}
	w.written[name] = data
}

func (w *cnpWorld) remove(t *testing.T, name string) {
	t.Helper()
	if _, ok := w.written[name]; !ok {
		return
	}
	if err := w.sim.RemoveFile(name); err != nil {
		t.Fatal(err)
	}
	delete(w.written, name)
}

// sync writes the cluster as it is now (cluster.yaml, and the policies in policyFile) and waits
// for every agent to have applied it.
func (w *cnpWorld) sync(t *testing.T, policyFile string) {
	t.Helper()
	w.write(t, cnpClusterFile, w.clusterYAML(t))
	w.write(t, policyFile, w.policyYAML(t))
	w.wait(t)
}

// wait waits until every agent's status says it applied the files as last written (read from
// its status: the revision of each file), then forgets tracked flows on every node, so a probe
// that reuses a 5-tuple meets the new rules.
func (w *cnpWorld) wait(t *testing.T) {
	t.Helper()
	if err := w.sim.WaitApplied(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	files := w.sim.Written()
	names := slices.Collect(maps.Keys(files))
	for _, a := range w.agents {
		var last statusapi.Status
		var lastErr error
		if !pollUntil(30*time.Second, func() bool {
			last, lastErr = statusapi.UnixClient(a.sock).Read(statusapi.Query{Files: names})
			return lastErr == nil && statusapi.Covers(last, files)
		}) {
			b, _ := json.MarshalIndent(last, "", "  ")
			a.mu.Lock()
			log := tail(a.log.String(), 30)
			a.mu.Unlock()
			t.Fatalf("the agent on %s did not apply the manifests within 30s (last error %v):\n%s\nlog:\n%s", a.nodeName, lastErr, b, log)
		}
	}
	if err := w.sim.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	for _, a := range w.agents {
		if out, err := exec.Command("ip", "netns", "exec", a.node.NetNSName, "conntrack", "-F").CombinedOutput(); err != nil && !strings.Contains(string(out), "0 flow entries") {
			t.Fatalf("conntrack -F on %s: %v %s", a.nodeName, err, out)
		}
	}
}

// pollUntil polls cond (a status read) until it holds or timeout passes: finely at first, then
// every 5 ms, as simnode.WaitStatus does.
func pollUntil(timeout time.Duration, cond func() bool) bool {
	start := time.Now()
	for {
		if cond() {
			return true
		}
		if time.Since(start) > timeout {
			return false
		}
		if time.Since(start) < 100*time.Millisecond {
			time.Sleep(250 * time.Microsecond)
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// cnpCase is one probe with what it must show.
type cnpCase struct {
	label  string // where it comes from: an upstream test and run, or "matrix"
	src    string // the source pod, "ns/name"
	dst    string // the destination: a pod, or an address's description
	probe  testbed.Probe
	table  *bool // the upstream expectation, when there is one
	oracle cnpVerdict
}

func (c cnpCase) want() bool { return c.oracle.Allowed() }

func (c cnpCase) String() string {
	return fmt.Sprintf("%s -> %s (%s) %s/%d", c.src, c.dst, c.probe.Dst, c.probe.Protocol, c.probe.Port)
}

// newCase builds the probe of a connection from a pod to an address with the oracle's verdict.
func (w *cnpWorld) newCase(o *cnpOracle, label, src, dstDesc string, dst netip.Addr, proto testbed.Protocol, port int) (cnpCase, bool) {
	tp := w.tpods[src]
	s := tp.IP(familyOf(dst))
	if !s.IsValid() {
		return cnpCase{}, false
	}
	return cnpCase{label: label, src: src, dst: dstDesc,
		probe:  testbed.Probe{Src: tp, Dst: dst, Port: uint16(port), Protocol: proto},
		oracle: o.Judge(cnpConn{SrcIP: s, DstIP: dst, Proto: corev1.Protocol(proto), Port: port})}, true
}

// cnpTarget is a destination of the matrix: an address and the ports probed on it.
type cnpTarget struct {
	desc  string
	addr  netip.Addr
	ports []cnpPort
}

type cnpPort struct {
	proto testbed.Protocol
	port  int
}

// matrix lists, from every pod, a probe to every other pod's addresses on podPorts and to every
// address a Node has (listed or not) on nodePorts, with the oracle's verdicts.
func (w *cnpWorld) matrix(o *cnpOracle, podPorts, nodePorts []cnpPort) []cnpCase {
	var targets []cnpTarget
	for _, k := range sortedKeys(w.tpods) {
		for _, ip := range w.tpods[k].IPs() {
			targets = append(targets, cnpTarget{k, ip, podPorts})
		}
	}
	for _, name := range sortedKeys(w.tnodes) {
		n := w.tnodes[name]
		for _, ip := range n.UnderlayIPs() {
			targets = append(targets, cnpTarget{name + " underlay", ip, nodePorts})
		}
		for _, ip := range n.NodeIPs() {
			targets = append(targets, cnpTarget{name + " pod-facing", ip, nodePorts})
		}
	}
	var out []cnpCase
	for _, src := range sortedKeys(w.tpods) {
		for _, tg := range targets {
			if tg.desc == src {
				continue
			}
			for _, p := range tg.ports {
				if c, ok := w.newCase(o, "matrix", src, tg.desc, tg.addr, p.proto, p.port); ok {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// isDrop reports whether a probe failed as a dropped packet makes it fail: by timing out before
// any answer. A refusal, an ICMP error or a reset fails it otherwise, and a TCP probe that timed
// out reading or writing had its connection established (the SYN passed): neither is a drop.
func isDrop(p testbed.Probe, err error) bool {
	var ne net.Error
	timeout := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
	if !timeout {
		return false
	}
	if p.Protocol == testbed.TCP {
		var oe *net.OpError
		return errors.As(err, &oe) && oe.Op == "dial"
	}
	return true
}

// cnpResult sums up one check.
type cnpResult struct {
	probes, allowed, denied int
}

// check probes every case and compares it with the oracle: an allowed connection must succeed,
// a denied one must time out (a drop, not a refusal). A case that carries an upstream
// expectation must also agree with it. An allowed probe that failed is probed again up to twice
// before it counts (a busy machine loses packets); a denied probe that succeeded is wrong at once.
func (w *cnpWorld) check(t *testing.T, step string, cases []cnpCase) cnpResult {
	t.Helper()
	var wrong []string
	for _, c := range cases {
		if c.table != nil && *c.table != c.want() {
			wrong = append(wrong, fmt.Sprintf("  %s [%s]: upstream expects %s, the oracle says %s", c, c.label, verdict(*c.table), c.oracle))
		}
	}
	probes := make([]testbed.Probe, len(cases))
	for i, c := range cases {
		probes[i] = c.probe
	}
	errs := w.sim.Bed.ProbeAllResults(context.Background(), probes)
	// An allowed probe that timed out is probed again, twice in a batch and then once more on
	// its own with a longer timeout: on a loaded machine a probe of a batch can be starved past its timeout. A
	// denied probe is never retried, so no lost packet can make a blocked flow pass.
	for attempt := 0; attempt < 3; attempt++ {
		var again []int
		for i, c := range cases {
			if c.want() && errs[i] != nil {
				again = append(again, i)
			}
		}
		if len(again) == 0 {
			break
		}
		retry := make([]testbed.Probe, len(again))
		for j, i := range again {
			retry[j] = probes[i]
		}
		var res []error
		if attempt < 2 {
			res = w.sim.Bed.ProbeAllResults(context.Background(), retry)
		} else {
			for _, p := range retry {
				p.Timeout = lastTryTimeout
				res = append(res, w.sim.Bed.ProbeAllResults(context.Background(), []testbed.Probe{p})[0])
			}
		}
		for j, i := range again {
			if res[j] == nil {
				t.Logf("%s: %s was transient (failed once: %v)", step, cases[i], errs[i])
			}
			errs[i] = res[j]
		}
	}
	var r cnpResult
	for i, c := range cases {
		r.probes++
		got := errs[i] == nil
		if c.want() {
			r.allowed++
		} else {
			r.denied++
		}
		switch {
		case got != c.want():
			why := "succeeded"
			if !got {
				why = "failed: " + errs[i].Error()
			}
			wrong = append(wrong, fmt.Sprintf("  %s [%s]: probe %s; the oracle says %s", c, c.label, why, c.oracle))
		case !got && !isDrop(c.probe, errs[i]):
			wrong = append(wrong, fmt.Sprintf("  %s [%s]: denied, but not dropped (%v); the oracle says %s", c, c.label, errs[i], c.oracle))
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		n := len(wrong)
		if n > 25 {
			wrong = append(wrong[:25], fmt.Sprintf("  ... and %d more", n-25))
		}
		t.Errorf("%s: %d of %d probes wrong:\n%s", step, n, len(cases), strings.Join(wrong, "\n"))
	}
	return r
}

// cnpWorldSlots bounds how many CNP worlds run at once, across the CNP tests. A world spends
// most of a step waiting out the timeouts of its denied probes, so more worlds than CPUs keep
// the machine busy; go test's -parallel (GOMAXPROCS by default) would allow two.
var cnpWorldSlots = make(chan struct{}, cnpMaxWorlds())

func cnpMaxWorlds() int {
	if s := os.Getenv("NETWARDEN_CNP_WORLDS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	// Four: with six, allowed probes of the matrix were starved past their timeouts (seen in
	// CI beside the rest of the e2e suite).
	return 4
}

// cnpCombo is a world's backend and topology.
type cnpCombo struct {
	topo testbed.Topology
	be   backend
}

// runCNPWorlds runs f as a subtest <topology>/<backend> per combination, all at once (t.Run from
// goroutines, within cnpWorldSlots).
func runCNPWorlds(t *testing.T, combos []cnpCombo, f func(t *testing.T, c cnpCombo)) {
	var wg sync.WaitGroup
	for _, c := range combos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(string(c.topo)+"/"+c.be.name, func(t *testing.T) {
				cnpWorldSlots <- struct{}{}
				defer func() { <-cnpWorldSlots }()
				f(t, c)
			})
		}()
	}
	wg.Wait()
}

// allCNPCombos: every backend in both topologies.
func allCNPCombos() []cnpCombo {
	var out []cnpCombo
	for _, topo := range []testbed.Topology{testbed.Routed, testbed.Bridge} {
		for _, be := range allBackends {
			out = append(out, cnpCombo{topo, be})
		}
	}
	return out
}

// requireNoReject fails if any node's rules reject rather than drop. Probes tell most rejections
// from drops (a reset, or an ICMP error refusing UDP or IPv4 TCP), but not all: TCP over IPv6
// takes an ICMPv6 error as soft and times out, and the raw SCTP probe sees no ICMP at all. So the
// rules themselves are read too.
func (w *cnpWorld) requireNoReject(t *testing.T, step string) {
	t.Helper()
	cmds := [][]string{{"nft", "list", "ruleset"}}
	if w.be.iptables() {
		cmds = [][]string{{"iptables-" + w.be.mode + "-save"}, {"ip6tables-" + w.be.mode + "-save"}}
	}
	for _, name := range sortedKeys(w.tnodes) {
		for _, cmd := range cmds {
			out, err := w.tnodes[name].Exec(context.Background(), cmd[0], cmd[1:]...)
			if err != nil {
				t.Errorf("%s: %v", step, err)
				continue
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(strings.ToLower(line), "reject") {
					t.Errorf("%s: %s on %s rejects where a denied connection must be dropped: %s", step, cmd[0], name, strings.TrimSpace(line))
				}
			}
		}
	}
}
