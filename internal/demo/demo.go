// Package demo runs `make demo`: a simulated node whose pods are network namespaces, the real
// agent reading the example manifests, and the connectivity matrix before and after the policies.
package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/simnode"
	"github.com/netwarden/netwarden/internal/source/manifests"
	"github.com/netwarden/netwarden/internal/testbed"
)

// Run executes the demo, writing a report for a person to out.
func Run(out io.Writer, agentBin, examplesDir string) error {
	start := time.Now()
	clusterFile := filepath.Join(examplesDir, "cluster.yaml")
	policiesFile := filepath.Join(examplesDir, "policies.yaml")
	masqFile := filepath.Join(examplesDir, "masq-config.yaml")
	st, errs := loadFile(clusterFile)
	if len(errs) > 0 {
		return fmt.Errorf("%s: %v", clusterFile, errs)
	}

	sim, err := simnode.New(simnode.Options{AgentBin: agentBin, Bed: testbed.Config{Topology: testbed.Routed, IPv4: true, IPv6: true}})
	if err != nil {
		return fmt.Errorf("creating the simulated node: %w", err)
	}
	defer sim.Close()
	fmt.Fprintf(out, "Simulated node %q: network namespace %s, routed veth pods, dual-stack.\n\n", sim.NodeName, sim.Bed.NodeNetNSName())

	var objs []runtime.Object
	for _, k := range sortedKeys(st.Namespaces) {
		ns := st.Namespaces[k].DeepCopy()
		ns.APIVersion, ns.Kind = "v1", "Namespace"
		objs = append(objs, ns)
	}
	var pods []*corev1.Pod
	var tpods []*testbed.Pod
	for _, k := range sortedKeys(st.Pods) {
		p := st.Pods[k]
		var ports []corev1.ContainerPort
		for _, c := range p.Spec.Containers {
			ports = append(ports, c.Ports...)
		}
		obj, tp, err := sim.AddPod(p.Namespace, p.Name, p.Labels, ports...)
		if err != nil {
			return err
		}
		pods, tpods = append(pods, obj), append(tpods, tp)
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
	before := sim.Syncs()
	if err := sim.StartAgent("--masq-config", masqFile); err != nil {
		return err
	}
	if err := sim.WaitSyncs(before, 20*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nAgent running: netwarden agent --manifests %s --masq-config %s\n", sim.Dir, masqFile)
	if err := printMasquerade(out, inet, tpods); err != nil {
		return err
	}
	printMatrices(out, sim, pods, tpods, "Before any NetworkPolicy: every pod reaches every pod")

	policies, err := os.ReadFile(policiesFile)
	if err != nil {
		return err
	}
	before = sim.Syncs()
	if err := sim.WriteFile("policies.yaml", policies); err != nil {
		return err
	}
	if err := sim.WaitSyncs(before, 20*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nApplied %s:\n", policiesFile)
	for _, line := range strings.Split(string(policies), "\n") {
		if strings.HasPrefix(line, "# ") {
			fmt.Fprintf(out, "  %s\n", strings.TrimPrefix(line, "# "))
		}
	}
	printMatrices(out, sim, pods, tpods, "After the policies")

	table, _ := sim.Nft("list", "table", "inet", "netwarden")
	fmt.Fprintf(out, "\nThe kernel now holds table inet netwarden: %d chains, %d lines of rules and sets.\n",
		strings.Count(table, "\tchain "), strings.Count(table, "\n"))
	masq, _ := sim.Nft("list", "table", "inet", "netwarden-masq")
	fmt.Fprintf(out, "Masquerade lives in its own table, inet netwarden-masq: %d rules, whatever the number of CIDRs.\n", countRules(masq))
	fmt.Fprintln(out, "`netwarden render --manifests DIR --node-name NAME` prints these rulesets without touching the kernel.")
	if err := sim.StopAgent(); err != nil {
		return fmt.Errorf("agent exit: %w", err)
	}
	fmt.Fprintf(out, "\nCleaned up. Demo took %.1fs.\n", time.Since(start).Seconds())
	return nil
}

// internetServers are the demo's servers outside the cluster, on documentation addresses.
var internetServers = []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8:aaaa::10")}

// printMasquerade shows what a server sees as the source of a new connection from each pod:
// outside the cluster the node's address, from another pod the pod's own.
func printMasquerade(out io.Writer, inet *testbed.Internet, tpods []*testbed.Pod) error {
	if len(tpods) < 2 {
		return nil
	}
	peer := tpods[0]
	srv, err := peer.StartWhoAmI(inet.Port)
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintf(out, "\nMasquerade: the source address a server sees for a new connection from each pod\n")
	fmt.Fprintf(out, "  %-24s %-34s %s\n", "from", "to the Internet", "to pod "+peer.String())
	for _, tp := range tpods[1:] {
		var internet, pod []string
		for _, dst := range internetServers {
			internet = append(internet, seenBy(tp, netip.AddrPortFrom(dst, inet.Port)))
		}
		for _, dst := range peer.IPs() {
			pod = append(pod, seenBy(tp, netip.AddrPortFrom(dst, inet.Port)))
		}
		fmt.Fprintf(out, "  %-24s %-34s %s\n", tp.String(), strings.Join(internet, ", "), strings.Join(pod, ", "))
	}
	fmt.Fprintf(out, "  The node's addresses towards the Internet are %s; pods keep theirs inside the cluster.\n", joinIPs(inet.NodeIPs))
	return nil
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

func seenBy(tp *testbed.Pod, dst netip.AddrPort) string {
	ip, err := tp.SourceSeenBy(context.Background(), dst)
	if err != nil {
		return "unreachable"
	}
	return ip.String()
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

// printMatrices probes TCP port 80 and 81 between every pair of pods, both families, and shows
// one grid per port. A cell is "ok" when both families connect, "--" when both are blocked.
func printMatrices(out io.Writer, sim *simnode.Sim, pods []*corev1.Pod, tpods []*testbed.Pod, title string) {
	fmt.Fprintf(out, "\n%s\n", title)
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Namespace + "/" + p.Name
	}
	for _, port := range []uint16{80, 81} {
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
		total := map[cell]int{}
		for i, w := range where {
			total[w]++
			if results[i] {
				allowed[w]++
			}
		}
		fmt.Fprintf(out, "\n  TCP port %d (%s)   rows: from, columns: to\n", port, portMeaning(port))
		width := 0
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
				mark := "·"
				switch k := (cell{r, c}); {
				case r == c:
				case allowed[k] == total[k]:
					mark = "ok"
				case allowed[k] == 0:
					mark = "--"
				default:
					mark = "partial"
				}
				fmt.Fprintf(out, " %-*s", width, mark)
			}
			fmt.Fprintln(out)
		}
	}
}

func portMeaning(port uint16) string {
	if port == 80 {
		return "http on web and api, sql on db"
	}
	return "metrics on api and db"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
