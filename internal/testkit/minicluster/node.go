package minicluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/kubelet"
	"github.com/netwarden/netwarden/internal/testkit/kubeproxy"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// AgentHealthAddr is where netwarden serves its health endpoints inside a node's namespace,
// as deploy/20-daemonset.yaml has it.
const AgentHealthAddr = "0.0.0.0:9491"

// Node is one node of the cluster: a network namespace on the underlay, where kube-proxy and
// netwarden run and the node daemon runs the pods scheduled to it.
type Node struct {
	Name    string
	IP      netip.Addr // InternalIP, on the underlay
	PodCIDR netip.Prefix
	// Dir holds the node's files: kubeconfigs, the CNI config and IPAM state, the gate socket,
	// the masquerade config.
	Dir string

	ns       *netNS
	apiFwd   *testbed.Forwarder // 127.0.0.1:<port> in the node netns → the API server
	agent    *kubetest.Process
	agentLg  *kubetest.LogBuffer
	agentCmd []string
	agentEnv []string
	proxy    *kubeproxy.Proxy
	kubelet  *kubelet.Daemon
	kubeLn   net.Listener
}

// String, NetNSPath, InNetNSGo and Forward make a Node a kubeproxy.Host.
func (n *Node) String() string                  { return n.Name }
func (n *Node) NetNSPath() string               { return n.ns.path() }
func (n *Node) InNetNSGo(fn func() error) error { return n.ns.do(fn) }
func (n *Node) Forward(listen, target string) (*testbed.Forwarder, error) {
	return testbed.NewForwarder(n.ns.do, n.ns.name, listen, target)
}

// Proxy is the node's kube-proxy.
func (n *Node) Proxy() *kubeproxy.Proxy { return n.proxy }

// AgentLogs is what the node's netwarden printed.
func (n *Node) AgentLogs() string { return n.agentLg.String() }

// cniConfList is the node's CNI chain: the upstream bridge and host-local, then netwarden's
// portmap and gate, as deploy/ documents for a node (the gate last: a pod starts once the
// agent has its verdicts installed).
func (n *Node) cniConfList() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       "minicluster",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": filepath.Join(n.Dir, "ipam"),
					"ranges":  []any{[]any{map[string]any{"subnet": n.PodCIDR.String()}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "netwarden-portmap", "capabilities": map[string]bool{"portMappings": true}},
			map[string]any{"type": "netwarden-gate", "socket": n.gateSocket()},
		},
	}
	return json.Marshal(conf)
}

func (n *Node) gateSocket() string { return filepath.Join(n.Dir, "gate.sock") }

// startAgent runs netwarden as deploy/20-daemonset.yaml runs it (its arguments, NODE_NAME from
// the pod's spec.nodeName, the netwarden-masq ConfigMap as the masquerade config, the gate
// socket of its commented-out option turned on), with the kubeconfig of the netwarden
// ServiceAccount in place of the in-cluster one.
func (n *Node) startAgent(bin, kubeconfig, backend string, masqConfig []byte) error {
	masq := filepath.Join(n.Dir, "masq-config")
	if err := os.WriteFile(masq, masqConfig, 0o644); err != nil {
		return err
	}
	n.agentCmd = []string{"netns", "exec", n.ns.name, bin, "agent",
		"--health-addr", AgentHealthAddr,
		"--masq-config", masq,
		"--gate-socket", n.gateSocket(),
		"--kubeconfig", kubeconfig,
	}
	if backend != "" {
		n.agentCmd = append(n.agentCmd, "--backend", backend)
	}
	n.agentEnv = append(os.Environ(), "NODE_NAME="+n.Name)
	n.agentLg = kubetest.NewLogBuffer("netwarden " + n.Name)
	return n.restartAgent()
}

// restartAgent starts the agent again (after StopAgent), as the DaemonSet's pod would be.
func (n *Node) restartAgent() error {
	p, err := kubetest.StartProcess("ip", n.agentCmd, n.agentEnv, n.agentLg)
	if err != nil {
		return fmt.Errorf("starting netwarden on %s: %w", n.Name, err)
	}
	n.agent = p
	return nil
}

// StopAgent stops the node's netwarden (its rules stay in the kernel).
func (n *Node) StopAgent() {
	if n.agent != nil {
		n.agent.Stop(30 * time.Second)
		n.agent = nil
	}
}

// StartAgent starts the node's netwarden again after StopAgent.
func (n *Node) StartAgent() error {
	if n.agent != nil {
		return nil
	}
	return n.restartAgent()
}

// AgentReady reads the agent's /readyz inside the node netns.
func (n *Node) AgentReady(ctx context.Context) error {
	if n.agent == nil {
		return fmt.Errorf("netwarden on %s is not running", n.Name)
	}
	if done, err := n.agent.Exited(); done {
		return fmt.Errorf("netwarden on %s exited (%v); its log:\n%s", n.Name, err, tail(n.agentLg.String(), 4000))
	}
	_, port, _ := net.SplitHostPort(AgentHealthAddr)
	body, status, err := testbed.HTTPGet(ctx, n.ns.do, "127.0.0.1:"+port, "/readyz")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("netwarden on %s: /readyz %d %s", n.Name, status, strings.TrimSpace(string(body)))
	}
	return nil
}
