// Package demo runs `make demo`: a simulated node whose pods are network namespaces, the real
// agent reading the example manifests, and the connectivity matrix before and after the policies.
package demo

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/source/manifests"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// Run executes the demo, writing a report for a person to out. It checks every verdict it
// shows against what it expects (examples/expected-verdicts.yaml after the policies, every pair
// open before them, the node's address only towards the Internet) and returns an error naming
// each difference.
func Run(out io.Writer, agentBin, examplesDir string) error {
	start := time.Now()
	clusterFile := filepath.Join(examplesDir, "manifests", "cluster.yaml")
	policiesFile := filepath.Join(examplesDir, "manifests", "policies.yaml")
	masqFile := filepath.Join(examplesDir, "masq-config.yaml")
	expectedFile := filepath.Join(examplesDir, ExpectedVerdictsFile)
	st, errs := loadFile(clusterFile)
	if len(errs) > 0 {
		return fmt.Errorf("%s: %v", clusterFile, errs)
	}
	names := slices.Sorted(st.Pods.Keys())
	expected, err := LoadExpected(expectedFile, names, ProbePorts)
	if err != nil {
		return err
	}

	sim, err := simnode.New(simnode.Options{AgentBin: agentBin, Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, IPv6: true}})
	if err != nil {
		return fmt.Errorf("creating the simulated node: %w", err)
	}
	defer sim.Close()
	fmt.Fprintf(out, "Simulated node %q: network namespace %s, routed veth pods, dual-stack.\n\n", sim.NodeName, sim.Bed.NodeNetNSName())

	var objs []runtime.Object
	for _, k := range slices.Sorted(maps.Keys(st.Namespaces)) {
		ns := st.Namespaces[k].DeepCopy()
		ns.APIVersion, ns.Kind = "v1", "Namespace"
		objs = append(objs, ns)
	}
	var tpods []*testbed.Pod
	for _, k := range names {
		p := st.Pods.Get(k)
		var ports []corev1.ContainerPort
		for _, cp := range p.Ports {
			ports = append(ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.Port, Protocol: cp.Protocol})
		}
		obj, tp, err := sim.AddPod(p.Namespace, p.Name, p.Labels, ports...)
		if err != nil {
			return err
		}
		tpods = append(tpods, tp)
		objs = append(objs, obj)
		fmt.Fprintf(out, "  pod %-22s %s\n", k, joinAddrs(tp))
	}
	// This node's Node object, with the pod CIDRs the pods' addresses come from, as the
	// cluster's IPAM would have set them: masquerade exempts pod-to-pod traffic by them.
	node := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: sim.NodeName}}
	for _, p := range []netip.Prefix{sim.Bed.Config().PodCIDRv4, sim.Bed.Config().PodCIDRv6} {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, p.String())
	}
	objs = append(objs, node)
	fmt.Fprintf(out, "  node %-21s podCIDRs %s\n", sim.NodeName, strings.Join(node.Spec.PodCIDRs, ", "))
	inet, err := sim.Bed.AddInternet(internetServers...)
	if err != nil {
		return fmt.Errorf("creating the Internet namespace: %w", err)
	}
	defer inet.Close()
	fmt.Fprintf(out, "  the Internet (default route of the node): servers on %s\n", joinIPs(internetServers))
	if err := sim.SetState(objs...); err != nil {
		return err
	}
	if err := sim.StartAgent("--masq-config", masqFile); err != nil {
		return err
	}
	// Every check below waits for the agent's own word (its /status) that the kernel holds
	// the state written, never for a log line or a fixed time.
	if err := sim.WaitApplied(20 * time.Second); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nAgent running: netwarden agent --manifests %s --masq-config %s\n", sim.Dir, masqFile)
	var problems []string
	masqOK, masqTotal, masqProblems := checkMasquerade(out, inet, tpods)
	problems = append(problems, masqProblems...)

	open := map[VerdictKey]bool{}
	for _, from := range names {
		for _, to := range names {
			for _, port := range ProbePorts {
				if from != to {
					open[VerdictKey{from, to, port}] = true
				}
			}
		}
	}
	beforeOK, beforeTotal, beforeProblems := checkMatrices(out, sim, names, tpods, open, "Before any NetworkPolicy: every pod reaches every pod")
	problems = append(problems, prefixAll("before the policies: ", beforeProblems)...)

	policies, err := os.ReadFile(policiesFile)
	if err != nil {
		return err
	}
	if err := sim.WriteFile("policies.yaml", policies); err != nil {
		return err
	}
	if err := sim.WaitApplied(20 * time.Second); err != nil {
		return err
	}
	status, err := sim.Status()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nApplied %s (the agent reports generation %d of the cluster state in the kernel):\n", policiesFile, status.NetworkPolicy.Generation)
	for _, line := range strings.Split(string(policies), "\n") {
		if strings.HasPrefix(line, "# ") {
			fmt.Fprintf(out, "  %s\n", strings.TrimPrefix(line, "# "))
		}
	}
	afterOK, afterTotal, afterProblems := checkMatrices(out, sim, names, tpods, expected, "After the policies (expected: "+expectedFile+")")
	problems = append(problems, prefixAll("after the policies: ", afterProblems)...)

	table, err := sim.Nft("list", "table", "inet", "netwarden")
	if err != nil {
		return fmt.Errorf("reading the NetworkPolicy table: %v: %s", err, table)
	}
	fmt.Fprintf(out, "\nThe kernel now holds table inet netwarden: %d chains, %d lines of rules and sets.\n",
		strings.Count(table, "\tchain "), strings.Count(table, "\n"))
	masq, err := sim.Nft("list", "table", "inet", "netwarden-masq")
	if err != nil {
		return fmt.Errorf("reading the masquerade table: %v: %s", err, masq)
	}
	fmt.Fprintf(out, "Masquerade lives in its own table, inet netwarden-masq: %d rules, whatever the number of CIDRs.\n", countRules(masq))
	fmt.Fprintln(out, "`netwarden render --manifests DIR --node-name NAME` prints these rulesets without touching the kernel.")
	if err := sim.StopAgent(); err != nil {
		return fmt.Errorf("agent exit: %w", err)
	}
	fmt.Fprintf(out, "\nCleaned up. Demo took %.1fs.\n", time.Since(start).Seconds())
	fmt.Fprintf(out, "masquerade: %d/%d sources as expected; before the policies: %d/%d pairs as expected\n", masqOK, masqTotal, beforeOK, beforeTotal)
	fmt.Fprintf(out, "verified: %d/%d pairs as expected\n", afterOK, afterTotal)
	if len(problems) > 0 {
		return fmt.Errorf("%d verdicts differ from what was expected:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	return nil
}

func prefixAll(prefix string, list []string) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = prefix + s
	}
	return out
}

// internetServers are the demo's servers outside the cluster, on documentation addresses.
var internetServers = []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8:aaaa::10")}

// checkMasquerade shows what a server sees as the source of a new connection from each pod,
// and checks it: outside the cluster the node's address, from another pod the pod's own.
func checkMasquerade(out io.Writer, inet *testbed.Internet, tpods []*testbed.Pod) (ok, total int, problems []string) {
	if len(tpods) < 2 {
		return 0, 0, nil
	}
	peer := tpods[0]
	srv, err := peer.StartWhoAmI(inet.Port)
	if err != nil {
		return 0, 1, []string{fmt.Sprintf("starting a server in %s: %v", peer, err)}
	}
	defer srv.Close()
	nodeIP := func(dst netip.Addr) netip.Addr {
		for _, ip := range inet.NodeIPs {
			if ip.Is4() == dst.Is4() {
				return ip
			}
		}
		return netip.Addr{}
	}
	check := func(tp *testbed.Pod, dst, want netip.Addr) string {
		total++
		got, err := tp.SourceSeenBy(context.Background(), netip.AddrPortFrom(dst, inet.Port))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("masquerade: %s to %s: unreachable (%v), want source %s", tp, dst, err, want))
			return "unreachable !"
		case got != want:
			problems = append(problems, fmt.Sprintf("masquerade: %s to %s: seen from %s, want %s", tp, dst, got, want))
			return got.String() + " !"
		}
		ok++
		return got.String()
	}
	fmt.Fprintf(out, "\nMasquerade: the source address a server sees for a new connection from each pod\n")
	fmt.Fprintf(out, "  %-24s %-34s %s\n", "from", "to the Internet", "to pod "+peer.String())
	for _, tp := range tpods[1:] {
		var internet, pod []string
		for _, dst := range internetServers {
			internet = append(internet, check(tp, dst, nodeIP(dst)))
		}
		for _, dst := range peer.IPs() {
			pod = append(pod, check(tp, dst, tp.IP(familyOf(dst))))
		}
		fmt.Fprintf(out, "  %-24s %-34s %s\n", tp.String(), strings.Join(internet, ", "), strings.Join(pod, ", "))
	}
	fmt.Fprintf(out, "  The node's addresses towards the Internet are %s; pods keep theirs inside the cluster.\n", joinIPs(inet.NodeIPs))
	return ok, total, problems
}

func familyOf(ip netip.Addr) int {
	if ip.Is4() {
		return 4
	}
	return 6
}

// countRules counts the rules in nft's listing of a table: the lines of its chains after the
// hook declaration.
func countRules(listing string) int {
	n, inChain := 0, false
	for _, line := range strings.Split(listing, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain "):
			inChain = true
		case line == "}":
			inChain = false
		case inChain && line != "" && !strings.HasPrefix(line, "type "):
			n++
		}
	}
	return n
}

func joinIPs(ips []netip.Addr) string {
	var s []string
	for _, ip := range ips {
		s = append(s, ip.String())
	}
	return strings.Join(s, ", ")
}

func loadFile(path string) (*cluster.State, []error) {
	dir, err := os.MkdirTemp("", "netwarden-demo-")
	if err != nil {
		return nil, []error{err}
	}
	defer os.RemoveAll(dir)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, []error{err}
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), data, 0o644); err != nil {
		return nil, []error{err}
	}
	return manifests.Load(dir, nil)
}

func joinAddrs(tp *testbed.Pod) string {
	var s []string
	for _, ip := range tp.IPs() {
		s = append(s, ip.String())
	}
	return strings.Join(s, ", ")
}

// ProbePorts are the TCP ports the demo probes between every pair of pods.
var ProbePorts = []uint16{80, 81}

// checkMatrices probes TCP port 80 and 81 between every pair of pods over both families, shows
// one grid per port and compares each pair with want. A pair is "ok" when both families
// connect and "DENIED" when both are blocked; a cell that differs from want is marked "!".
func checkMatrices(out io.Writer, sim *simnode.Sim, names []string, tpods []*testbed.Pod, want map[VerdictKey]bool, title string) (ok, total int, problems []string) {
	fmt.Fprintf(out, "\n%s\n", title)
	for _, port := range ProbePorts {
		type cell struct{ r, c int }
		var probes []testbed.Probe
		var where []cell
		for r := range tpods {
			for c := range tpods {
				if r == c {
					continue
				}
				for _, ip := range tpods[c].IPs() {
					probes = append(probes, testbed.Probe{Src: tpods[r], Dst: ip, Port: port, Protocol: testbed.TCP})
					where = append(where, cell{r, c})
				}
			}
		}
		results := sim.Bed.ProbeAll(context.Background(), probes)
		allowed := map[cell]int{}
		probed := map[cell]int{}
		for i, w := range where {
			probed[w]++
			if results[i] {
				allowed[w]++
			}
		}
		fmt.Fprintf(out, "\n  TCP port %d (%s)   rows: from, columns: to\n", port, portMeaning(port))
		width := len("DENIED !")
		for _, n := range names {
			width = max(width, len(n))
		}
		fmt.Fprintf(out, "  %-*s", width+2, "")
		for _, n := range names {
			fmt.Fprintf(out, " %-*s", width, n)
		}
		fmt.Fprintln(out)
		for r := range names {
			fmt.Fprintf(out, "  %-*s", width+2, names[r])
			for c := range names {
				k := cell{r, c}
				if r == c {
					fmt.Fprintf(out, " %-*s", width, "·")
					continue
				}
				total++
				mark := "PARTIAL"
				switch {
				case allowed[k] == probed[k]:
					mark = "ok"
				case allowed[k] == 0:
					mark = "DENIED"
				}
				wantOpen := want[VerdictKey{names[r], names[c], port}]
				if (mark == "ok" && wantOpen) || (mark == "DENIED" && !wantOpen) {
					ok++
				} else {
					problems = append(problems, fmt.Sprintf("%s -> %s TCP/%d: probed %s (%d of %d families connected), want %s",
						names[r], names[c], port, strings.ToLower(mark), allowed[k], probed[k], verdictWord(wantOpen)))
					mark += " !"
				}
				fmt.Fprintf(out, " %-*s", width, mark)
			}
			fmt.Fprintln(out)
		}
	}
	if len(problems) == 0 {
		fmt.Fprintf(out, "  %d/%d pairs as expected.\n", ok, total)
	} else {
		fmt.Fprintf(out, "  %d/%d pairs as expected; cells marked ! differ.\n", ok, total)
	}
	return ok, total, problems
}

func portMeaning(port uint16) string {
	if port == 80 {
		return "http on web and api, sql on db"
	}
	return "metrics on api and db"
}
