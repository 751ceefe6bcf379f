// Package cni_test drives netwarden-portmap and netwarden-ipmasq through libcni as a container
// runtime would, chained after the real upstream bridge and host-local plugins, inside network
// namespaces the tests create: a "node", an "external" host on a veth, and pods.
package cni_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// pluginDir holds the upstream bridge and host-local plugins and ours, built by TestMain.
var pluginDir string
var buildErr error

func TestMain(m *testing.M) {
	// The plugins' lock and backend-choice files go to a directory of this run, not /run.
	lockDir, err := os.MkdirTemp("", "netwarden-cni-lock-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("NETWARDEN_CNI_LOCK_DIR", lockDir)
	if os.Geteuid() == 0 {
		pluginDir, buildErr = buildPlugins()
	}
	code := m.Run()
	if pluginDir != "" {
		os.RemoveAll(pluginDir)
	}
	os.RemoveAll(lockDir)
	os.Exit(code)
}

// buildPlugins builds the upstream plugins from the module version in go.mod, and ours.
func buildPlugins() (string, error) {
	dir, err := os.MkdirTemp("", "netwarden-cni-bin-")
	if err != nil {
		return "", err
	}
	pkgs := []string{
		"github.com/containernetworking/plugins/plugins/main/bridge",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
		"github.com/netwarden/netwarden/cmd/netwarden-portmap",
		"github.com/netwarden/netwarden/cmd/netwarden-ipmasq",
		"github.com/netwarden/netwarden/cmd/netwarden-gate",
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as make build and upstream's releases build them
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out.String())
	}
	return dir, nil
}

func requireKernel(t testing.TB) {
	t.Helper()
	kerneltest.RequireAgent(t, simnode.AgentBinary)
	for _, c := range []string{"iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy"} {
		if _, err := exec.LookPath(c); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s missing (make deps installs it)", c)
			}
			t.Skipf("skipping: %s missing (make deps installs it)", c)
		}
	}
	if buildErr != nil {
		t.Fatalf("building CNI plugins: %v", buildErr)
	}
}

// backends are run by every kernel test: nftables and both iptables variants.
var backends = []string{"nftables", "iptables-nft", "iptables-legacy"}

const (
	network  = "nwtest"
	nodeIP4  = "198.51.100.1"
	nodeIP4b = "198.51.100.3" // a second node address, which hostIP mappings must ignore
	extIP4   = "198.51.100.2"
	nodeIP6  = "2001:db8:100::1"
	extIP6   = "2001:db8:100::2"
)

// node is a node netns with a CNI configuration, linked by a veth to an external netns.
type node struct {
	t       testing.TB
	backend string
	ns, ext ns.NetNS
	// sandbox is the CNI_NETNS of attachments made by execPlugin (skel refuses the plugin's own).
	sandbox  ns.NetNS
	cfg      *libcni.CNIConfig
	cacheDir string
	list     *libcni.NetworkConfigList
}

func newNS(t testing.TB) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		if err := testbed.RemoveNetNSMount(n.Path()); err != nil {
			t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

func nsName(n ns.NetNS) string { return filepath.Base(n.Path()) }

// sh runs a command in a netns and fails the test on error.
func sh(t testing.TB, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := shErr(n, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

func shErr(n ns.NetNS, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", nsName(n)}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s: %v: %s", nsName(n), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// newNode builds the node and external namespaces and the conflist for backend. extra is merged
// into the netwarden-portmap config.
func newNode(t *testing.T, backend string, extra map[string]any) *node {
	t.Helper()
	n := newBareNode(t, backend)
	n.ext = newNS(t)
	for _, c := range [][]string{
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		{"sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"},
		{"ip", "link", "add", "ext0", "type", "veth", "peer", "name", "node0", "netns", nsName(n.ext)},
		{"ip", "addr", "add", nodeIP4 + "/24", "dev", "ext0"},
		{"ip", "addr", "add", nodeIP4b + "/24", "dev", "ext0"},
		{"ip", "addr", "add", nodeIP6 + "/64", "dev", "ext0", "nodad"},
		{"ip", "link", "set", "ext0", "up"},
	} {
		sh(t, n.ns, c...)
	}
	// As on a Kubernetes node, bridged pod-to-pod packets pass the IP hooks (the reply of a pod
	// reached through a host port must meet conntrack to be un-DNATed).
	for _, k := range []string{"net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1"} {
		if _, err := shErr(n.ns, "sysctl", "-qw", k); err != nil {
			t.Logf("br_netfilter not available (%v): pod-to-pod through a host port may fail", err)
		}
	}
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", extIP4 + "/24", "dev", "node0"},
		{"ip", "addr", "add", extIP6 + "/64", "dev", "node0", "nodad"},
		{"ip", "link", "set", "node0", "up"},
	} {
		sh(t, n.ext, c...)
	}
	dir := t.TempDir()
	n.cacheDir = filepath.Join(dir, "cache")
	n.cfg = libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, n.cacheDir, nil)
	pm := map[string]any{"type": "netwarden-portmap", "backend": backend, "capabilities": map[string]bool{"portMappings": true}}
	for k, v := range extra {
		pm[k] = v
	}
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       network,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type": "host-local", "dataDir": filepath.Join(dir, "ipam"),
					"ranges": []any{
						[]any{map[string]string{"subnet": "10.88.0.0/24"}},
						[]any{map[string]string{"subnet": "fd00:88::/64"}},
					},
					"routes": []any{map[string]string{"dst": "0.0.0.0/0"}, map[string]string{"dst": "::/0"}},
				},
			},
			pm,
			map[string]any{"type": "netwarden-ipmasq", "backend": backend},
		},
	}
	b, _ := json.Marshal(conf)
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("conflist: %v", err)
	}
	n.list = list
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rules in the node at failure:\n%s", compact(n.dumpRules()))
		}
	})
	return n
}

// newBareNode is a node netns with forwarding on and nothing else, for execPlugin.
func newBareNode(t testing.TB, backend string) *node {
	t.Helper()
	n := &node{t: t, backend: backend, ns: newNS(t), sandbox: newNS(t)}
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
	} {
		sh(t, n.ns, c...)
	}
	return n
}

// inNode runs fn with the calling thread in the node netns, so that plugins exec'd by libcni
// act on the node.
func (n *node) inNode(fn func() error) error {
	return n.ns.Do(func(ns.NetNS) error { return fn() })
}

// pod is one container attached through the conflist.
type pod struct {
	name string
	ns   ns.NetNS
	rt   *libcni.RuntimeConf
	ip4  netip.Addr
	ip6  netip.Addr
}

type portMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

func (n *node) runtimeConf(id string, podNS ns.NetNS, maps []portMapping) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: podNS.Path(), IfName: "eth0",
		CapabilityArgs: map[string]any{"portMappings": maps}}
}

// addPod creates a pod netns, ADDs it through the conflist and starts its servers.
func (n *node) addPod(name string, maps ...portMapping) *pod {
	t := n.t
	t.Helper()
	p := &pod{name: name, ns: newNS(t)}
	p.rt = n.runtimeConf("ctr-"+name, p.ns, maps)
	var res types.Result
	err := n.inNode(func() error {
		var err error
		res, err = n.cfg.AddNetworkList(context.Background(), n.list, p.rt)
		return err
	})
	if err != nil {
		t.Fatalf("ADD %s: %v", name, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, ipc := range r.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		if a = a.Unmap(); a.Is4() {
			p.ip4 = a
		} else {
			p.ip6 = a
		}
	}
	if !p.ip4.IsValid() || !p.ip6.IsValid() {
		t.Fatalf("ADD %s: want an IPv4 and an IPv6 address, got %v", name, r.IPs)
	}
	serve(t, p.ns, name, 80)
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("NETWARDEN_CNI_DEBUG") != "" {
			a, _ := shErr(p.ns, "ip", "addr")
			s, _ := shErr(p.ns, "ss", "-ltnu")
			t.Logf("pod %s:\n%s\n%s", name, a, s)
		}
	})
	return p
}

func (n *node) del(p *pod) {
	n.t.Helper()
	if err := n.inNode(func() error { return n.cfg.DelNetworkList(context.Background(), n.list, p.rt) }); err != nil {
		n.t.Fatalf("DEL %s: %v", p.name, err)
	}
}

func (n *node) check(p *pod) error {
	return n.inNode(func() error { return n.cfg.CheckNetworkList(context.Background(), n.list, p.rt) })
}

// dumpRules lists what our plugins hold in the node, for failure messages and leak checks.
func (n *node) dumpRules() string {
	var out strings.Builder
	if n.backend == "nftables" {
		for _, tbl := range []string{"netwarden-portmap", "netwarden-ipmasq"} {
			s, _ := shErr(n.ns, "nft", "list", "table", "inet", tbl)
			out.WriteString(s)
		}
		return out.String()
	}
	mode := strings.TrimPrefix(n.backend, "iptables-")
	for _, c := range []string{"iptables-" + mode + "-save", "ip6tables-" + mode + "-save"} {
		s, _ := shErr(n.ns, c, "-t", "nat")
		out.WriteString(s)
	}
	return out.String()
}

// natRules returns the rule lines of our tables that translate: DNAT, SNAT or masquerade
// (jumps, returns and chain headers are not rules that can leak traffic).
func (n *node) natRules() []string {
	var rules []string
	for _, line := range strings.Split(n.dumpRules(), "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "dnat") && !strings.Contains(l, "ct status dnat") && !strings.Contains(l, "ctstate dnat") ||
			strings.Contains(l, "masquerade") || strings.Contains(l, "snat to") {
			rules = append(rules, strings.TrimSpace(line))
		}
	}
	return rules
}

// serve starts TCP and UDP servers on port, for each family, in netns. Each answers with its
// name and the source address it saw. (Listening per family, because Go's probe for dual-stack
// sockets depends on the netns it first runs in.)
func serve(t testing.TB, n ns.NetNS, name string, port int) {
	t.Helper()
	for _, fam := range []string{"4", "6"} {
		var tl net.Listener
		var ul net.PacketConn
		err := n.Do(func(ns.NetNS) error {
			var err error
			if tl, err = net.Listen("tcp"+fam, fmt.Sprintf(":%d", port)); err != nil {
				return err
			}
			ul, err = net.ListenPacket("udp"+fam, fmt.Sprintf(":%d", port))
			return err
		})
		if err != nil {
			t.Fatalf("server in %s: %v", name, err)
		}
		t.Cleanup(func() { tl.Close(); ul.Close() })
		go func() {
			for {
				c, err := tl.Accept()
				if err != nil {
					return
				}
				ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s %s", name, ap.Addr().Unmap())
				c.Close()
			}
		}()
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := ul.ReadFrom(buf)
				if err != nil {
					return
				}
				ap, _ := netip.ParseAddrPort(from.String())
				ul.WriteTo([]byte(fmt.Sprintf("%s %s", name, ap.Addr().Unmap())), from)
			}
		}()
	}
}

// dial connects from netns to addr ("tcp" or "udp") and returns the server's answer.
func dial(from ns.NetNS, proto, addr string) (string, error) {
	var reply string
	err := from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout(proto, addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		if proto == "udp" {
			if _, err := c.Write([]byte("ping")); err != nil {
				return err
			}
		}
		buf := make([]byte, 128)
		k, err := c.Read(buf)
		if k > 0 {
			reply = string(buf[:k])
			return nil
		}
		return err
	})
	return reply, err
}

// expectReply asserts that addr answers from netns with the server name (and, if seen is not
// empty, the source address it saw). A busy machine may drop a packet, so it tries three times.
func expectReply(t testing.TB, from ns.NetNS, fromName, proto, addr, server, seen string) {
	t.Helper()
	var got string
	var err error
	for range 3 {
		if got, err = dial(from, proto, addr); err == nil {
			break
		}
	}
	want := server
	if seen != "" {
		want += " " + seen
	}
	if err != nil || (seen == "" && !strings.HasPrefix(got, server+" ")) || (seen != "" && got != want) {
		t.Errorf("%s -> %s %s: got %q, %v; want %q", fromName, proto, addr, got, err, want)
	}
}

// expectNoReply asserts that addr does not answer.
func expectNoReply(t testing.TB, from ns.NetNS, fromName, proto, addr string) {
	t.Helper()
	if got, err := dial(from, proto, addr); err == nil {
		t.Errorf("%s -> %s %s: answered %q, want no answer", fromName, proto, addr, got)
	}
}

func hostPort(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

// execPlugin runs one of our plugins directly in the node with a given config, for the cases a
// runtime cannot produce through libcni (chosen prevResults, many concurrent attachments).
func (n *node) execPlugin(plugin, command, containerID string, conf []byte) (types.Result, error) {
	var res types.Result
	err := n.inNode(func() error {
		args := &invoke.Args{Command: command, ContainerID: containerID, NetNS: n.sandbox.Path(), IfName: "eth0", Path: pluginDir}
		var err error
		if command == "ADD" {
			res, err = invoke.ExecPluginWithResult(context.Background(), filepath.Join(pluginDir, plugin), conf, args, nil)
		} else {
			err = invoke.ExecPluginWithoutResult(context.Background(), filepath.Join(pluginDir, plugin), conf, args, nil)
		}
		return err
	})
	return res, err
}

// pluginConf is a config for one of our plugins with a synthetic prevResult (without IPs if ip4
// is empty).
func pluginConf(plugin, backend string, ip4 string, maps []portMapping, extra map[string]any) []byte {
	c := map[string]any{
		"cniVersion": "1.1.0", "name": network, "type": plugin, "backend": backend,
		"runtimeConfig": map[string]any{"portMappings": maps},
		"prevResult": map[string]any{
			"cniVersion": "1.1.0",
			"interfaces": []any{map[string]string{"name": "cni0"}, map[string]string{"name": "eth0", "sandbox": "/proc/self/ns/net"}},
			"ips":        []any{},
		},
	}
	if ip4 != "" {
		c["prevResult"].(map[string]any)["ips"] = []any{map[string]any{"address": ip4 + "/16", "interface": 1}}
	}
	for k, v := range extra {
		c[k] = v
	}
	b, _ := json.Marshal(c)
	return b
}

// compact drops empty bucket chains and dispatch jumps from a ruleset listing.
func compact(rules string) string {
	lines := strings.Split(rules, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if strings.HasSuffix(l, "{") && i+1 < len(lines) && strings.TrimSpace(lines[i+1]) == "}" {
			i++
			continue
		}
		if l == "" || (strings.HasPrefix(l, "jump ") && strings.Contains(l, "-b") && !strings.Contains(l, "comment")) ||
			strings.HasPrefix(l, ":NW") || (strings.HasPrefix(l, "-A NW") && strings.Contains(l, "-dispatch -j")) {
			continue
		}
		out = append(out, lines[i])
	}
	return strings.Join(out, "\n")
}
