package cni_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/netwarden/netwarden/internal/cni"
)

func forBackends(t *testing.T, fn func(t *testing.T, backend string)) {
	requireKernel(t)
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { fn(t, b) })
	}
}

// attChains lists the attachment chain names our plugins hold in the node.
var attChainRE = regexp.MustCompile(`(?m)(?:chain |^:)((?:pm|ps|mq|NWPM|NWPS|NWMQ)-[0-9a-f]{8}-[0-9a-f]{12})\b`)

func (n *node) attChains() []string {
	var out []string
	for _, m := range attChainRE.FindAllStringSubmatch(n.dumpRules(), -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}

func chainNames(backend string, att cni.Attachment, groups ...string) []string {
	var out []string
	for _, g := range groups {
		if backend != "nftables" {
			g = map[string]string{"pm": "NWPM", "ps": "NWPS", "mq": "NWMQ"}[g]
		}
		out = append(out, g+"-"+att.ID())
	}
	return out
}

func att(containerID string) cni.Attachment {
	return cni.Attachment{Network: network, IfName: "eth0", ContainerID: containerID}
}

// rulesOf returns the rules of one chain as the backend lists them.
func (n *node) rulesOf(chain string) string {
	if n.backend == "nftables" {
		tbl := "netwarden-portmap"
		if strings.HasPrefix(chain, "mq-") {
			tbl = "netwarden-ipmasq"
		}
		out, _ := shErr(n.ns, "nft", "-a", "list", "chain", "inet", tbl, chain)
		return out
	}
	mode := strings.TrimPrefix(n.backend, "iptables-")
	var out strings.Builder
	for _, c := range []string{"iptables-" + mode, "ip6tables-" + mode} {
		s, _ := shErr(n.ns, c, "-t", "nat", "-S", chain)
		out.WriteString(s)
	}
	return out.String()
}

// tamper deletes (or, with replacement, rewrites) the first DNAT rule of an attachment's DNAT
// chain behind the plugin's back, as an administrator or another tool might.
func (n *node) tamper(t *testing.T, chain, replacement string) {
	t.Helper()
	if n.backend == "nftables" {
		var handle string
		for _, l := range strings.Split(n.rulesOf(chain), "\n") {
			if strings.Contains(l, " dnat ") {
				handle = l[strings.LastIndex(l, "handle ")+len("handle "):]
				break
			}
		}
		if handle == "" {
			t.Fatalf("no DNAT rule in %s:\n%s", chain, n.rulesOf(chain))
		}
		if replacement == "" {
			sh(t, n.ns, "nft", "delete", "rule", "inet", "netwarden-portmap", chain, "handle", handle)
		} else {
			sh(t, n.ns, "sh", "-c", fmt.Sprintf("nft replace rule inet netwarden-portmap %s handle %s %s", chain, handle, replacement))
		}
		return
	}
	ipt := "iptables-" + strings.TrimPrefix(n.backend, "iptables-")
	// Rule 1 is the loopback RETURN, rule 2 the first DNAT.
	if replacement == "" {
		sh(t, n.ns, ipt, "-t", "nat", "-D", chain, "2")
	} else {
		sh(t, n.ns, "sh", "-c", fmt.Sprintf("%s -t nat -R %s 2 %s", ipt, chain, replacement))
	}
}

// TestCheck: CHECK passes on what ADD installed and reports a deleted or altered rule, a
// missing jump and a missing table; DEL still cleans up after tampering.
func TestCheck(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		a := n.addPod("a", portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, portMapping{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"})
		if err := n.check(a); err != nil {
			t.Fatalf("CHECK after ADD: %v", err)
		}
		dnat := chainNames(backend, att("ctr-a"), "pm")[0]
		expectCheckFails := func(what, want string) {
			t.Helper()
			err := n.check(a)
			if err == nil {
				t.Errorf("CHECK after %s passed; rules:\n%s", what, n.rulesOf(dnat))
			} else if !strings.Contains(err.Error(), want) {
				t.Errorf("CHECK after %s: %v; want it to say %q", what, err, want)
			}
		}
		n.tamper(t, dnat, "")
		expectCheckFails("deleting a DNAT rule", "missing")

		n.del(a)
		a = n.addPod("a2", portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, portMapping{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"})
		dnat = chainNames(backend, att("ctr-a2"), "pm")[0]
		repl := "tcp dport 8080 dnat ip to 10.88.0.250:80"
		if backend != "nftables" {
			repl = "-p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.250:80"
		}
		n.tamper(t, dnat, repl)
		expectCheckFails("altering a DNAT rule", "altered")

		// CHECK reports the first broken plugin of the chain, so the ipmasq case needs a pod
		// whose portmap rules are intact.
		n.del(a)
		a = n.addPod("a3")
		if backend == "nftables" {
			sh(t, n.ns, "nft", "delete", "table", "inet", "netwarden-ipmasq")
			expectCheckFails("deleting the ipmasq table", "does not exist")
		} else {
			ipt := "iptables-" + strings.TrimPrefix(backend, "iptables-")
			mq := chainNames(backend, att("ctr-a3"), "mq")[0]
			b := fmt.Sprintf("NWMQ-b%02d", cni.BucketOf(att("ctr-a3").ID()))
			sh(t, n.ns, ipt, "-t", "nat", "-F", b)
			expectCheckFails("deleting the jump to "+mq, "jump rules")
		}
		n.del(a)
		if left := n.attChains(); len(left) > 0 {
			t.Errorf("chains left after DEL: %v", left)
		}
	})
}

// TestGC: GC removes exactly the attachments of this network that are not valid, whichever of
// the two keys carries the list, and leaves other networks alone.
func TestGC(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		a := n.addPod("a", portMapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
		b := n.addPod("b", portMapping{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"})
		// An attachment of another network, with the same container ID and ifname as a.
		other := pluginConf("netwarden-portmap", backend, "10.77.0.5", []portMapping{{HostPort: 8090, ContainerPort: 80, Protocol: "tcp"}}, map[string]any{"name": "other"})
		if _, err := n.execPlugin("netwarden-portmap", "ADD", "ctr-a", other); err != nil {
			t.Fatalf("ADD in network other: %v", err)
		}
		otherChains := chainNames(backend, cni.Attachment{Network: "other", IfName: "eth0", ContainerID: "ctr-a"}, "pm", "ps")
		serve(t, n.ext, "ext", 7000)
		expectReply(t, n.ext, "external before GC", "tcp", hostPort(nodeIP4, 8080), "a", "")

		// A runtime with no cached results (a fresh cache dir), so only the plugins' own GC can
		// remove a's rules.
		fresh := libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, t.TempDir(), nil)
		gc := func(valid ...*pod) {
			t.Helper()
			args := &libcni.GCArgs{}
			for _, p := range valid {
				args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.rt.ContainerID, IfName: p.rt.IfName})
			}
			if err := n.inNode(func() error { return fresh.GCNetworkList(context.Background(), n.list, args) }); err != nil {
				t.Fatalf("GC: %v", err)
			}
		}
		gc(b)
		expectNoReply(t, n.ext, "external after GC", "tcp", hostPort(nodeIP4, 8080))
		expectReply(t, n.ext, "external after GC", "tcp", hostPort(nodeIP4, 8081), "b", "")
		expectReply(t, b.ns, "pod b after GC", "tcp", hostPort(extIP4, 7000), "ext", nodeIP4)
		have := n.attChains()
		want := append(chainNames(backend, att("ctr-b"), "pm", "ps", "mq"), otherChains...)
		slices.Sort(want)
		if !slices.Equal(have, want) {
			t.Errorf("after GC keeping b: chains %v, want %v", have, want)
		}
		if err := n.check(b); err != nil {
			t.Errorf("CHECK b after GC: %v", err)
		}
		if err := n.check(a); err == nil {
			t.Errorf("CHECK a after GC removed it passed")
		}

		// The older key alone is honoured too.
		for _, plugin := range []string{"netwarden-portmap", "netwarden-ipmasq"} {
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":%q,"backend":%q,"cni.dev/attachments":[{"containerID":"ctr-b","ifname":"eth0"}]}`, network, plugin, backend)
			if _, err := n.execPlugin(plugin, "GC", "", []byte(conf)); err != nil {
				t.Fatalf("GC %s with cni.dev/attachments: %v", plugin, err)
			}
		}
		if have := n.attChains(); !slices.Equal(have, want) {
			t.Errorf("after GC with the old key keeping b: chains %v, want %v", have, want)
		}
		gc()
		slices.Sort(otherChains)
		if have := n.attChains(); !slices.Equal(have, otherChains) {
			t.Errorf("after GC keeping nothing: chains %v, want only network other's %v", have, otherChains)
		}
	})
}

// TestSameIPTwoAttachments: "ADD A with IP X, ADD B with IP X, DEL A" leaves B intact, for both
// plugins, even when A and B map the same host port.
func TestSameIPTwoAttachments(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		maps := []portMapping{{HostPort: 7070, ContainerPort: 70, Protocol: "tcp"}, {HostPort: 7070, ContainerPort: 70, Protocol: "udp"}}
		for _, plugin := range []string{"netwarden-portmap", "netwarden-ipmasq"} {
			conf := pluginConf(plugin, backend, "10.99.0.5", maps, nil)
			for _, id := range []string{"A", "B"} {
				if _, err := n.execPlugin(plugin, "ADD", id, conf); err != nil {
					t.Fatalf("%s ADD %s: %v", plugin, id, err)
				}
			}
			if _, err := n.execPlugin(plugin, "DEL", "A", conf); err != nil {
				t.Fatalf("%s DEL A: %v", plugin, err)
			}
			if _, err := n.execPlugin(plugin, "CHECK", "B", conf); err != nil {
				t.Errorf("%s CHECK B after DEL A: %v", plugin, err)
			}
			if _, err := n.execPlugin(plugin, "CHECK", "A", conf); err == nil {
				t.Errorf("%s CHECK A after DEL A passed", plugin)
			}
		}
		want := chainNames(backend, att("B"), "pm", "ps", "mq")
		slices.Sort(want)
		if have := n.attChains(); !slices.Equal(have, want) {
			t.Errorf("chains %v, want B's %v", have, want)
		}
		if rules := strings.Join(n.natRules(), "\n"); !strings.Contains(rules, "10.99.0.5") {
			t.Errorf("B's rules for 10.99.0.5 are gone:\n%s", rules)
		}
	})
}

// TestConcurrent: 64 concurrent ADDs, then 32 DELs concurrent with 32 more ADDs, across both
// plugins, leave exactly the expected attachments, each passing CHECK.
func TestConcurrent(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		conf := func(plugin string, i int) []byte {
			return pluginConf(plugin, backend, fmt.Sprintf("10.99.%d.%d", i/200, i%200+1),
				[]portMapping{{HostPort: 20000 + i, ContainerPort: 80, Protocol: "udp"}}, nil)
		}
		plugins := []string{"netwarden-portmap", "netwarden-ipmasq"}
		run := func(cmds map[int]string) {
			t.Helper()
			var wg sync.WaitGroup
			errs := make(chan error, 2*len(cmds))
			for i, cmd := range cmds {
				for _, plugin := range plugins {
					wg.Go(func() {
						if _, err := n.execPlugin(plugin, cmd, fmt.Sprintf("c%d", i), conf(plugin, i)); err != nil {
							errs <- fmt.Errorf("%s %s c%d: %w", plugin, cmd, i, err)
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		}
		first := map[int]string{}
		for i := range 64 {
			first[i] = "ADD"
		}
		run(first)
		second := map[int]string{}
		for i := range 32 {
			second[i] = "DEL"
			second[64+i] = "ADD"
		}
		run(second)
		var want []string
		for i := 32; i < 96; i++ {
			want = append(want, chainNames(backend, att(fmt.Sprintf("c%d", i)), "pm", "ps", "mq")...)
		}
		slices.Sort(want)
		have := n.attChains()
		if !slices.Equal(have, want) {
			t.Errorf("after concurrent ADD/DEL: %d chains, want %d\nextra: %v\nmissing: %v", len(have), len(want), minus(have, want), minus(want, have))
		}
		for i := 32; i < 96; i += 7 {
			for _, plugin := range plugins {
				if _, err := n.execPlugin(plugin, "CHECK", fmt.Sprintf("c%d", i), conf(plugin, i)); err != nil {
					t.Errorf("CHECK c%d: %v", i, err)
				}
			}
		}
	})
}

func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// TestInvalidConfig: bad input is a CNI error with the right code naming the field, and
// installs nothing.
func TestInvalidConfig(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		good := []portMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}
		badConds := map[string]any{"conditionsV4": []string{"!", "-s", "192.0.2.0/24"}}
		if backend != "nftables" {
			badConds = map[string]any{"conditionsV4": []string{"ip saddr != 192.0.2.0/24"}}
		}
		noPrev := pluginConf("netwarden-portmap", backend, "10.99.0.5", good, nil)
		noPrev = []byte(strings.Replace(string(noPrev), `"prevResult"`, `"notPrevResult"`, 1))
		cases := []struct {
			name  string
			conf  []byte
			code  uint
			field string
		}{
			{"bad host port", pluginConf("netwarden-portmap", backend, "10.99.0.5", []portMapping{{HostPort: 0, ContainerPort: 80, Protocol: "tcp"}}, nil), types.ErrInvalidNetworkConfig, "runtimeConfig.portMappings[0].hostPort"},
			{"bad protocol", pluginConf("netwarden-portmap", backend, "10.99.0.5", []portMapping{{HostPort: 80, ContainerPort: 80, Protocol: "gre"}}, nil), types.ErrInvalidNetworkConfig, "runtimeConfig.portMappings[0].protocol"},
			{"bad hostIP", pluginConf("netwarden-portmap", backend, "10.99.0.5", []portMapping{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "1.2.3"}}, nil), types.ErrInvalidNetworkConfig, "runtimeConfig.portMappings[0].hostIP"},
			{"localhost without opt-in", pluginConf("netwarden-portmap", backend, "10.99.0.5", []portMapping{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "127.0.0.1"}}, nil), types.ErrInvalidNetworkConfig, "runtimeConfig.portMappings[0].hostIP"},
			{"conditions of the other backend", pluginConf("netwarden-portmap", backend, "10.99.0.5", good, badConds), types.ErrInvalidNetworkConfig, "conditionsV4[0]"},
			{"no prevResult", noPrev, types.ErrInvalidNetworkConfig, "prevResult"},
			{"bad backend", pluginConf("netwarden-portmap", "ebpf", "10.99.0.5", good, nil), types.ErrInvalidNetworkConfig, "backend"},
			{"not JSON", []byte(`{"cniVersion":"1.1.0","name":`), types.ErrDecodingFailure, ""},
		}
		for _, c := range cases {
			_, err := n.execPlugin("netwarden-portmap", "ADD", "bad", c.conf)
			var te *types.Error
			if !errors.As(err, &te) {
				t.Errorf("%s: want a CNI error, got %v", c.name, err)
				continue
			}
			if te.Code != c.code || !strings.Contains(te.Msg, c.field) {
				t.Errorf("%s: got code %d %q, want code %d naming %q", c.name, te.Code, te.Msg, c.code, c.field)
			}
		}
		if have := n.attChains(); len(have) > 0 {
			t.Errorf("invalid ADDs installed chains %v", have)
		}
	})
}

// TestStatus: STATUS fails with "plugin not available" where the backend's tools are missing.
func TestStatus(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newNode(t, backend, nil)
		conf := func(plugin string) []byte {
			return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":%q,"backend":%q}`, network, plugin, backend))
		}
		plugins := []string{"netwarden-portmap", "netwarden-ipmasq"}
		for _, plugin := range plugins {
			if _, err := n.execPlugin(plugin, "STATUS", "", conf(plugin)); err != nil {
				t.Errorf("%s STATUS: %v", plugin, err)
			}
		}
		t.Setenv("PATH", t.TempDir())
		for _, plugin := range plugins {
			_, err := n.execPlugin(plugin, "STATUS", "", conf(plugin))
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable {
				t.Errorf("%s STATUS without %s tools: %v, want code %d", plugin, backend, err, types.ErrPluginNotAvailable)
			}
		}
	})
}

// TestNoState: on a node where the plugins never ran, DEL (with or without a prevResult) and GC
// succeed, and CHECK reports the missing rules.
func TestNoState(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		n := newBareNode(t, backend)
		maps := []portMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "udp"}}
		for _, plugin := range []string{"netwarden-portmap", "netwarden-ipmasq"} {
			conf := pluginConf(plugin, backend, "10.99.0.5", maps, nil)
			bare := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":%q,"backend":%q}`, network, plugin, backend))
			for _, c := range []struct {
				cmd  string
				conf []byte
			}{{"DEL", conf}, {"DEL", bare}, {"GC", bare}} {
				if _, err := n.execPlugin(plugin, c.cmd, "x", c.conf); err != nil {
					t.Errorf("%s %s on a fresh node: %v", plugin, c.cmd, err)
				}
			}
			if _, err := n.execPlugin(plugin, "CHECK", "x", conf); err == nil {
				t.Errorf("%s CHECK on a fresh node passed", plugin)
			}
		}
		// An attachment with nothing to install (no port mappings; no IPs) is added and checked
		// without any table.
		noMaps := pluginConf("netwarden-portmap", backend, "10.99.0.6", nil, nil)
		noIPs := pluginConf("netwarden-ipmasq", backend, "", nil, nil)
		for plugin, conf := range map[string][]byte{"netwarden-portmap": noMaps, "netwarden-ipmasq": noIPs} {
			for _, cmd := range []string{"ADD", "CHECK", "DEL"} {
				if _, err := n.execPlugin(plugin, cmd, "empty", conf); err != nil {
					t.Errorf("%s %s of an attachment with nothing to install: %v", plugin, cmd, err)
				}
			}
		}
		if have := n.attChains(); len(have) > 0 {
			t.Errorf("chains left: %v", have)
		}
	})
}
