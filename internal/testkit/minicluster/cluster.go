// Package minicluster runs a Kubernetes cluster of several nodes on one machine, without a
// container engine, made of the real components: etcd and kube-apiserver (internal/testkit/
// kubetest), kube-controller-manager and kube-scheduler, and on every node kube-proxy,
// netwarden (run as deploy/ runs it) and a node daemon that does a kubelet's part of the job
// (internal/testkit/kubelet: the Node, its Lease, pods as network namespaces through the CNI
// chain, agnhost containers, exec and logs). The upstream suites run against it unmodified.
//
// Where things are:
//   - the control plane runs in the namespace Start is called from, on 127.0.0.1;
//   - each node is a network namespace "nwmc-<6 hex>-<node>" with an uplink (eth0) on an
//     underlay bridge that lives in "nwmc-<6 hex>-underlay" (UnderlayPrefix), and a route to
//     every other node's pod CIDR (ClusterCIDR, a /24 each) through that node: pods of
//     different nodes talk without NAT, as in a flat pod network;
//   - components in a node netns reach the API server through a forwarder (127.0.0.1:<port>
//     in the node netns → the API server's loopback address), and the API server reaches the
//     kubelets (exec, logs) through an HTTP CONNECT egress proxy on a unix socket that dials
//     from the underlay, as Konnectivity would.
//
// Nothing is configured in the caller's network namespace: no link, address, route or rule.
package minicluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/testkit/kubelet"
	"github.com/netwarden/netwarden/internal/testkit/kubeproxy"
	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// Options configure a cluster. Zero values get the defaults noted.
type Options struct {
	// Nodes is the number of nodes (default 2, at most MaxNodes).
	Nodes int
	// ProxyMode is kube-proxy's mode on every node (default nftables).
	ProxyMode kubeproxy.Mode
	// Backend is netwarden's --backend (default: deploy/'s, which is auto: nftables here).
	Backend string
	// BinDir holds the Kubernetes binaries of hack/kube-binaries.sh (default as kubetest finds
	// them): kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kube-proxy, agnhost.
	BinDir string
	// AgentBin is the netwarden binary (default $NETWARDEN_BIN).
	AgentBin string
	// CNIBinDirs hold bridge, host-local, netwarden-portmap and netwarden-gate.
	CNIBinDirs []string
	// DeployDir is netwarden's deploy/ (default: found above the working directory).
	DeployDir string
	// ReadyTimeout bounds Start's wait for every node and component (default 3 minutes).
	ReadyTimeout time.Duration
}

// Cluster is a running cluster.
type Cluster struct {
	Server *kubetest.Server
	// Kubeconfig is an admin kubeconfig (the context "minicluster") for kubectl and the suites.
	Kubeconfig string
	Nodes      []*Node
	Client     kubernetes.Interface

	opts      Options
	t         kubetest.TB
	id        string
	dir       string
	ul        *underlay
	egress    *testbed.Forwarder
	kcm       *component
	scheduler *component
}

// Start creates the cluster and waits until every node is Ready with netwarden and kube-proxy
// ready on it. t.Cleanup tears it all down; when t failed, the components' logs are logged.
func Start(t kubetest.TB, opts Options) *Cluster {
	t.Helper()
	c, err := start(t, opts)
	if err != nil {
		t.Fatalf("minicluster: %v", err)
	}
	return c
}

func start(t kubetest.TB, opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Nodes < 1 || opts.Nodes > MaxNodes {
		return nil, fmt.Errorf("Options.Nodes %d: want 1 to %d", opts.Nodes, MaxNodes)
	}
	if opts.ProxyMode == "" {
		opts.ProxyMode = kubeproxy.NFTables
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	binDir := kubetest.BinDir(t, opts.BinDir, "kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kube-proxy", "agnhost")
	opts.BinDir = binDir
	if opts.AgentBin == "" {
		opts.AgentBin = os.Getenv("NETWARDEN_BIN")
	}
	if opts.AgentBin == "" {
		return nil, errors.New("no netwarden binary: set Options.AgentBin or $NETWARDEN_BIN (make build puts it in bin/netwarden)")
	}
	if opts.DeployDir == "" {
		d, err := findDeployDir()
		if err != nil {
			return nil, err
		}
		opts.DeployDir = d
	}
	for _, p := range []string{"bridge", "host-local", "netwarden-portmap", "netwarden-gate"} {
		if !inDirs(opts.CNIBinDirs, p) {
			return nil, fmt.Errorf("CNI plugin %s is in none of Options.CNIBinDirs %v", p, opts.CNIBinDirs)
		}
	}
	id := make([]byte, 3)
	rand.Read(id)
	c := &Cluster{opts: opts, t: t, id: "nwmc-" + hex.EncodeToString(id), dir: t.TempDir()}
	socket := filepath.Join(c.dir, "egress.sock")
	egressConfig := filepath.Join(c.dir, "egress-selector.yaml")
	if err := os.WriteFile(egressConfig, []byte(egressSelectorConfig(socket)), 0o644); err != nil {
		return nil, err
	}
	c.Server = kubetest.Start(t, kubetest.Options{BinDir: binDir, ExtraAPIServerArgs: []string{
		"--egress-selector-config-file=" + egressConfig,
		// A controller manager runs: pods get their namespace's "default" service account, as
		// in any cluster (kubetest alone disables the plugin, having nothing to create them).
		"--disable-admission-plugins=",
		// The node names resolve nowhere: the kubelets are reached at their InternalIPs, as
		// kubeadm's clusters prefer.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
	}})
	// Registered after kubetest's own cleanup, so it runs first: the nodes go while the API
	// server still answers them.
	t.Cleanup(func() {
		if t.Failed() {
			c.logAll()
		}
		if err := c.stop(); err != nil {
			t.Logf("minicluster: teardown: %v", err)
		}
	})
	var err error
	if c.ul, err = newUnderlay(c.id); err != nil {
		return nil, err
	}
	if c.egress, err = startEgressProxy(socket, c.DialUnderlay); err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, c.Server.URL, c.Server.AdminToken); err != nil {
		return nil, err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Server.AdminConfig()); err != nil {
		return nil, err
	}
	c.Server.InstallClusterNetworkPolicyCRD(t, kubetest.CRDExperimental)
	if err := c.kubectl("apply", "-f", filepath.Join(opts.DeployDir, "00-rbac.yaml")); err != nil {
		return nil, err
	}
	if c.kcm, err = startControllerManager(binDir, c.Kubeconfig, c.Server); err != nil {
		return nil, err
	}
	if c.scheduler, err = startScheduler(binDir, c.Kubeconfig); err != nil {
		return nil, err
	}

	masq, err := deployMasqConfig(filepath.Join(opts.DeployDir, "10-masq-config.yaml"))
	if err != nil {
		return nil, err
	}
	token, err := c.serviceAccountToken("kube-system", "netwarden")
	if err != nil {
		return nil, err
	}
	for k := range opts.Nodes {
		if err := c.addNode(k, token, masq); err != nil {
			return nil, err
		}
	}
	return c, c.waitReady()
}

// addNode creates node k, adds it to c.Nodes (whose teardown undoes what was made of it, if
// a step fails) and starts its components: netwarden first, so that the gate has an agent to
// ask when the first pod comes; the node daemon last, as its Node makes the node schedulable.
func (c *Cluster) addNode(k int, agentToken string, masq []byte) error {
	name := fmt.Sprintf("node-%d", k+1)
	n := &Node{Name: name, IP: nodeUnderlayIP(k), PodCIDR: nodePodCIDR(k), Dir: filepath.Join(c.dir, name)}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return err
	}
	ns, err := newNetNS(c.id+"-"+name, map[string]string{
		"net.ipv4.ip_forward":                 "1",
		"net.ipv4.conf.all.rp_filter":         "0",
		"net.ipv4.conf.default.rp_filter":     "0",
		"net.bridge.bridge-nf-call-iptables":  "1",
		"net.bridge.bridge-nf-call-ip6tables": "1",
	})
	if err != nil {
		return err
	}
	n.ns = ns
	c.Nodes = append(c.Nodes, n)
	if err := c.ul.attach(n.ns, k, c.opts.Nodes); err != nil {
		return err
	}
	if n.apiFwd, err = n.Forward("127.0.0.1:0", strings.TrimPrefix(c.Server.URL, "https://")); err != nil {
		return err
	}
	agentKubeconfig := filepath.Join(n.Dir, "netwarden.kubeconfig")
	if err := c.writeKubeconfig(agentKubeconfig, "https://"+n.apiFwd.Addr().String(), agentToken); err != nil {
		return err
	}
	if err := n.startAgent(c.opts.AgentBin, agentKubeconfig, c.opts.Backend, masq); err != nil {
		return err
	}
	n.proxy = kubeproxy.New(c.t, kubeproxy.Options{Node: n, NodeName: name, Server: c.Server, Mode: c.opts.ProxyMode,
		ClusterCIDRs: []netip.Prefix{ClusterCIDR}, BinDir: c.opts.BinDir})
	if err := n.proxy.Start(); err != nil {
		return err
	}
	conflist, err := n.cniConfList()
	if err != nil {
		return err
	}
	if err := n.ns.do(func() error {
		var err error
		n.kubeLn, err = net.Listen("tcp", net.JoinHostPort(n.IP.String(), "10250"))
		return err
	}); err != nil {
		return fmt.Errorf("kubelet API of %s: %w", name, err)
	}
	n.kubelet, err = kubelet.Start(context.Background(), kubelet.Config{
		NodeName:    name,
		Client:      c.Client,
		NodeNetNS:   n.ns.path(),
		NodeIPs:     []netip.Addr{n.IP},
		PodCIDRs:    []netip.Prefix{n.PodCIDR},
		Listener:    n.kubeLn,
		CNIConfList: conflist,
		CNIBinDirs:  c.opts.CNIBinDirs,
		Agnhost:     filepath.Join(c.opts.BinDir, "agnhost"),
		StateDir:    filepath.Join(n.Dir, "kubelet"),
		Logf:        func(format string, args ...any) { c.t.Logf("kubelet %s: "+format, append([]any{name}, args...)...) },
	})
	if err != nil {
		return fmt.Errorf("node daemon of %s: %w", name, err)
	}
	return nil
}

// waitReady waits until every Node is Ready, and netwarden and kube-proxy are ready on it.
func (c *Cluster) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.ReadyTimeout)
	defer cancel()
	var last error
	for {
		last = c.notReady(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ready after %v: %w", c.opts.ReadyTimeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) notReady(ctx context.Context) error {
	for _, comp := range []*component{c.kcm, c.scheduler} {
		if err := comp.exited(); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if !nodeReady(node) {
			return fmt.Errorf("node %s is not Ready", n.Name)
		}
		if err := n.AgentReady(ctx); err != nil {
			return err
		}
		if err := n.proxy.Healthz(ctx); err != nil {
			return fmt.Errorf("kube-proxy on %s: %w", n.Name, err)
		}
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// DialUnderlay dials addr (TCP) from the underlay namespace: the egress proxy's way to the
// kubelets, and a client outside every node (for NodePorts).
func (c *Cluster) DialUnderlay(ctx context.Context, addr string) (net.Conn, error) {
	var conn net.Conn
	err := c.ul.ns.do(func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return conn, err
}

// InUnderlay runs fn on a thread in the underlay namespace, the world outside the nodes: a
// server it starts there is an address outside the cluster, which the nodes reach through
// their default route (and masquerade).
func (c *Cluster) InUnderlay(fn func() error) error { return c.ul.ns.do(fn) }

// PodNetNS is the path of pod's network namespace, as its node made it.
func PodNetNS(pod *corev1.Pod) string {
	return kubelet.NetNSPath(pod.Spec.NodeName, pod.Namespace, pod.Name, string(pod.UID))
}

func (c *Cluster) writeKubeconfig(path, server, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["minicluster"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: bytes.Clone(c.Server.CACert)}
	cfg.AuthInfos["minicluster"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["minicluster"] = &clientcmdapi.Context{Cluster: "minicluster", AuthInfo: "minicluster", Namespace: corev1.NamespaceDefault}
	cfg.CurrentContext = "minicluster"
	return clientcmd.WriteToFile(*cfg, path)
}

// serviceAccountToken is a token of the service account, valid for two days (a cluster of
// make cluster-up may live that long; kubetest's tokens last an hour).
func (c *Cluster) serviceAccountToken(namespace, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	expiry := int64(48 * 3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of service account %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// kubectl runs kubectl with the admin kubeconfig.
func (c *Cluster) kubectl(args ...string) error {
	cmd := exec.Command(filepath.Join(c.opts.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+c.dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// logAll logs every component's output (for a failed test).
func (c *Cluster) logAll() {
	for _, comp := range []*component{c.kcm, c.scheduler} {
		if comp != nil {
			c.t.Logf("minicluster: %s log:\n%s", comp.name, tail(comp.logs.String(), 64<<10))
		}
	}
	for _, n := range c.Nodes {
		if n.agentLg != nil {
			c.t.Logf("minicluster: netwarden on %s log:\n%s", n.Name, tail(n.agentLg.String(), 64<<10))
		}
	}
}

// stop tears the cluster down: the nodes' pods and components, the namespaces, the control
// plane (kubetest stops the API server and etcd through its own cleanup).
func (c *Cluster) stop() error {
	var errs []error
	for _, n := range c.Nodes {
		if n.kubelet != nil {
			errs = append(errs, n.kubelet.Stop())
		}
		if n.kubeLn != nil {
			n.kubeLn.Close()
		}
		n.StopAgent()
		if n.proxy != nil {
			n.proxy.Kill()
		}
		if n.apiFwd != nil {
			n.apiFwd.Close()
		}
		if n.ns != nil {
			errs = append(errs, n.ns.remove())
		}
	}
	for _, comp := range []*component{c.kcm, c.scheduler} {
		if comp != nil {
			comp.stop()
		}
	}
	if c.egress != nil {
		c.egress.Close()
	}
	if c.ul != nil {
		errs = append(errs, c.ul.remove())
	}
	return errors.Join(errs...)
}

// deployMasqConfig is the "config" of deploy/'s netwarden-masq ConfigMap.
func deployMasqConfig(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(data, &cm); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cfg, ok := cm.Data["config"]
	if !ok {
		return nil, fmt.Errorf("%s: the ConfigMap has no \"config\" key", path)
	}
	return []byte(cfg), nil
}

// findDeployDir finds deploy/ in the first directory above the working directory that holds
// netwarden's go.mod.
func findDeployDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if mod, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(mod, []byte("module github.com/netwarden/netwarden\n")) {
			return filepath.Join(d, "deploy"), nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no netwarden checkout above %s: set Options.DeployDir", wd)
		}
	}
}

func inDirs(dirs []string, name string) bool {
	for _, d := range dirs {
		if fi, err := os.Stat(filepath.Join(d, name)); err == nil && !fi.IsDir() {
			return true
		}
	}
	return false
}
