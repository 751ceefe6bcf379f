package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netwarden/netwarden/internal/gateproto"
	"github.com/netwarden/netwarden/internal/testkit/simnode"
)

const gateBenchPods = 60

// BenchmarkGateAdd measures what the runtime waits for when it starts a pod through bridge,
// host-local and netwarden-gate, on a node whose agent already judges other pods: netwarden-
// gate's ADD alone (process start, the agent's compile, rules, guard, answer), the agent's
// answer alone (the same request from this process), the chain before the gate, and the whole
// chain with the gate, as p50 and p99. Every pod is isolated by a policy, so
// each ADD changes the kernel's rules and the guard's known set.
func BenchmarkGateAdd(b *testing.B) {
	requireKernel(b)
	for range b.N {
		g := newGateNode(b, "nftables")
		objs := []runtime.Object{simnode.Namespace("x", nil), onlyFromAllowed()}
		for i := range gateBenchPods {
			objs = append(objs, gatePodObject("x", fmt.Sprintf("pod-%d", i), map[string]string{"app": "target"}))
		}
		g.setState(b, objs...)
		g.startAgent(b)
		bare := g.conflist(b, filepath.Join(filepath.Dir(g.cacheDir), "ipam"), nil, false)
		gateConf := g.list.Plugins[len(g.list.Plugins)-1]
		var whole, chain, gated, agentOnly []time.Duration
		for i := range gateBenchPods {
			p := g.newPod(b, "x", fmt.Sprintf("pod-%d", i), "")
			if i%3 == 0 {
				start := time.Now()
				if err := g.add(g.list, p); err != nil {
					b.Fatalf("ADD %s: %v", p.name, err)
				}
				whole = append(whole, time.Since(start))
				continue
			}
			var prev types.Result
			start := time.Now()
			err := g.inNode(func() error {
				var err error
				prev, err = g.cfg.AddNetworkList(context.Background(), bare, p.rt)
				return err
			})
			if err != nil {
				b.Fatalf("ADD %s without the gate: %v", p.name, err)
			}
			chain = append(chain, time.Since(start))
			if i%3 == 2 {
				// The agent's part alone: the plugin's request from this process.
				res, err := current.NewResultFromResult(prev)
				if err != nil {
					b.Fatal(err)
				}
				req := gateproto.Request{Verb: gateproto.VerbAdd, Attachment: gateproto.Attachment{ContainerID: p.rt.ContainerID, IfName: "eth0"},
					Namespace: "x", Name: p.name}
				for _, ipc := range res.IPs {
					req.IPs = append(req.IPs, ipc.Address.IP.String())
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start = time.Now()
				resp, err := gateproto.Call(ctx, g.sock, req)
				cancel()
				if err != nil || resp.Error != "" {
					b.Fatalf("gate request for %s: %v %s", p.name, err, resp.Error)
				}
				agentOnly = append(agentOnly, time.Since(start))
				continue
			}
			conf, err := gateWithPrev(gateConf, prev)
			if err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			err = g.inNode(func() error {
				_, err := invoke.ExecPluginWithResult(context.Background(), filepath.Join(pluginDir, "netwarden-gate"), conf,
					&invoke.Args{Command: "ADD", ContainerID: p.rt.ContainerID, NetNS: p.rt.NetNS, IfName: "eth0", PluginArgs: p.rt.Args, Path: pluginDir}, nil)
				return err
			})
			if err != nil {
				b.Fatalf("netwarden-gate ADD %s: %v", p.name, err)
			}
			gated = append(gated, time.Since(start))
		}
		if os.Getenv("GATE_DEBUG") != "" {
			g.logMu.Lock()
			b.Logf("%s", tailLines(g.agentLog.String(), 30))
			g.logMu.Unlock()
		}
		b.ReportMetric(pct(gated, 50), "gate-add-p50-ms")
		b.ReportMetric(pct(gated, 99), "gate-add-p99-ms")
		b.ReportMetric(pct(agentOnly, 50), "agent-answer-p50-ms")
		b.ReportMetric(pct(agentOnly, 99), "agent-answer-p99-ms")
		b.ReportMetric(pct(chain, 50), "bridge-hostlocal-add-p50-ms")
		b.ReportMetric(pct(whole, 50), "chain-with-gate-add-p50-ms")
		b.ReportMetric(pct(whole, 99), "chain-with-gate-add-p99-ms")
	}
}

// gateWithPrev is the gate's config from the conflist with prevResult set, as libcni passes it.
func gateWithPrev(conf *libcni.PluginConfig, prev types.Result) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(conf.Bytes, &m); err != nil {
		return nil, err
	}
	m["cniVersion"], m["name"] = "1.1.0", network
	m["prevResult"] = prev
	return json.Marshal(m)
}
