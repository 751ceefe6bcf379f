package kubelet

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/netwarden/netwarden/internal/testkit/kubetest"
	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// Addresses inside the namespaces the tests make (private ranges, never routed outside them).
var (
	testNodeIP  = netip.MustParsePrefix("10.250.0.1/24")
	testPodCIDR = netip.MustParsePrefix("10.251.0.0/24")
)

const agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.53"

// requireRoot skips (fails under CI) without root: namespaces and mounts need it.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("the kubelet tests need root (CI is set: they must run)")
	}
	t.Skip("skipping: the kubelet tests need root")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pluginDir != "" {
		os.RemoveAll(pluginDir)
	}
	os.Exit(code)
}

var (
	buildOnce  sync.Once
	pluginDir  string
	agnhostBin string
	buildErr   error
)

// binaries builds the upstream bridge and host-local CNI plugins (the versions in go.mod) and
// finds or builds agnhost, once per test binary. binDir is where hack/kube-binaries.sh put the
// Kubernetes binaries: agnhost is taken from there when present.
func binaries(t *testing.T, binDir string) (plugins, agnhost string) {
	t.Helper()
	buildOnce.Do(func() {
		pluginDir, buildErr = os.MkdirTemp("", "nwk-test-bin-")
		if buildErr != nil {
			return
		}
		began := time.Now()
		if buildErr = goBuild("", pluginDir+"/",
			"github.com/containernetworking/plugins/plugins/main/bridge",
			"github.com/containernetworking/plugins/plugins/ipam/host-local"); buildErr != nil {
			return
		}
		agnhostBin = filepath.Join(binDir, "agnhost")
		if fi, err := os.Stat(agnhostBin); err == nil && fi.Mode()&0o111 != 0 {
			t.Logf("CNI plugins built in %v; agnhost from %s", time.Since(began).Round(time.Millisecond), agnhostBin)
			return
		}
		agnhostBin, buildErr = buildAgnhost(pluginDir)
		t.Logf("CNI plugins and agnhost built in %v", time.Since(began).Round(time.Millisecond))
	})
	if buildErr != nil {
		t.Fatalf("building the test binaries: %v", buildErr)
	}
	return pluginDir, agnhostBin
}

func goBuild(dir, out string, pkgs ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-o", out}, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, buf.String())
	}
	return nil
}

// buildAgnhost builds k8s.io/kubernetes/test/images/agnhost at the Kubernetes version that
// hack/kubetools pins. Until hack/kubetools lists agnhost (it needs go.sum entries of its own),
// the build runs in a copy of that module's go.mod and go.sum with -mod=mod, which leaves the
// repository untouched.
func buildAgnhost(outDir string) (string, error) {
	tools, err := findKubetools()
	if err != nil {
		return "", err
	}
	out := filepath.Join(outDir, "agnhost")
	const pkg = "k8s.io/kubernetes/test/images/agnhost"
	env := append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if err := runGo(tools, env, "build", "-o", out, pkg); err == nil {
		return out, nil
	}
	tmp, err := os.MkdirTemp("", "nwk-kubetools-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(tools, f))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return "", err
		}
	}
	if err := runGo(tmp, env, "build", "-mod=mod", "-o", out, pkg); err != nil {
		return "", err
	}
	return out, nil
}

func runGo(dir string, env []string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Env = dir, env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, buf.String())
	}
	return nil
}

func findKubetools() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "hack", "kubetools", "go.mod")); err == nil {
			return filepath.Join(d, "hack", "kubetools"), nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("hack/kubetools not found above the working directory")
		}
	}
}

// testNode is a node netns with an address on a dummy link, and a running daemon.
type testNode struct {
	name      string
	netnsPath string
	stateDir  string
	listener  net.Listener
	d         *Daemon
	client    kubernetes.Interface
}

// newTestNetNS makes a named network namespace with lo up and, when addr is valid, a link eth0
// holding it. It is removed at the end of the test.
func newTestNetNS(t *testing.T, addr netip.Prefix) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "nwktest-node-" + hex.EncodeToString(b)
	f, uts, err := newNamespaces(name, "node")
	if err != nil {
		t.Fatalf("node netns: %v", err)
	}
	uts.Close()
	path := filepath.Join(NetNSDir, name)
	t.Cleanup(func() {
		if err := testbed.RemoveNetNSMount(path); err != nil {
			t.Errorf("removing the node netns: %v", err)
		}
	})
	defer f.Close()
	h, err := netlink.NewHandleAt(netns.NsHandle(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("lo up in %s: %v", name, err)
	}
	if addr.IsValid() {
		// A veth pair with both ends in the namespace: dummy links need a module that kernels
		// may lack.
		eth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-peer"}
		if err := h.LinkAdd(eth); err != nil {
			t.Fatalf("veth in %s: %v", name, err)
		}
		if peer, err := h.LinkByName("eth0-peer"); err != nil || h.LinkSetUp(peer) != nil {
			t.Fatalf("veth peer in %s: %v", name, err)
		}
		nl, err := netlink.ParseAddr(addr.String())
		if err == nil {
			err = h.AddrAdd(eth, nl)
		}
		if err == nil {
			err = h.LinkSetUp(eth)
		}
		if err != nil {
			t.Fatalf("address %s in %s: %v", addr, name, err)
		}
	}
	return path
}

// tempStateDir is a state directory that is removed only when nothing is mounted below it: a
// RemoveAll through a leftover bind mount would reach the host's files.
func tempStateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nwk-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m, err := mountsBelow(dir)
		if err != nil || len(m) > 0 {
			t.Errorf("mounts left below %s (kept): %v %v", dir, m, err)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

func conflist(ipamDir string) []byte {
	b, _ := json.Marshal(map[string]any{
		"cniVersion": "1.1.0",
		"name":       "nwk-test",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": ipamDir,
					"ranges":  []any{[]any{map[string]string{"subnet": testPodCIDR.String()}}},
					"routes":  []any{map[string]string{"dst": "0.0.0.0/0"}},
				},
			},
		},
	})
	return b
}

// startNode starts a kube-apiserver (with extra arguments) and a daemon for node name.
func startNode(t *testing.T, name string, nodeIPs []netip.Addr, nodeAddr netip.Prefix, listenAddr string, apiArgs ...string) (*testNode, *kubetest.Server) {
	t.Helper()
	requireRoot(t)
	srv := kubetest.Start(t, kubetest.Options{ExtraAPIServerArgs: apiArgs})
	binDir := filepath.Dir(kubetest.Binary(t, "kube-apiserver"))
	plugins, agnhost := binaries(t, binDir)

	n := &testNode{name: name, client: srv.AdminClient(t)}
	n.netnsPath = newTestNetNS(t, nodeAddr)
	n.stateDir = tempStateDir(t)
	l, err := net.Listen("tcp", listenAddr)
	if err != nil {
		t.Fatal(err)
	}
	n.listener = l
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	n.d, err = Start(ctx, Config{
		NodeName:    name,
		Client:      n.client,
		NodeNetNS:   n.netnsPath,
		NodeIPs:     nodeIPs,
		PodCIDRs:    []netip.Prefix{testPodCIDR},
		Labels:      map[string]string{"netwarden.io/test": "kubelet"},
		Listener:    l,
		CNIConfList: conflist(filepath.Join(n.stateDir, "ipam")),
		CNIBinDirs:  []string{plugins},
		Agnhost:     agnhost,
		StateDir:    n.stateDir,
		Logf:        t.Logf,
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("daemon started in %v", time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := n.d.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
		n.assertNoLeftovers(t)
	})
	return n, srv
}

// assertNoLeftovers checks that no pod netns of the node and no mount below its state dir is
// left.
func (n *testNode) assertNoLeftovers(t *testing.T) {
	t.Helper()
	entries, _ := os.ReadDir(NetNSDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "nwk-"+n.name+"-") {
			t.Errorf("netns %s left after Stop", e.Name())
		}
	}
	if m, err := mountsBelow(n.stateDir); err != nil || len(m) > 0 {
		t.Errorf("mounts left below %s after Stop: %v %v", n.stateDir, m, err)
	}
}

func (n *testNode) kubeletURL(path string, q url.Values) string {
	return (&url.URL{Scheme: "https", Host: n.listener.Addr().String(), Path: path, RawQuery: q.Encode()}).String()
}

// waitPod polls the pod until cond holds, and returns it.
func waitPod(t *testing.T, c kubernetes.Interface, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *corev1.Pod
	for {
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = pod
			if cond(pod) {
				return pod
			}
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("pod %s/%s: not %s after %v (last error %v); last seen:\n%s", ns, name, what, timeout, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitPodGone(t *testing.T, c kubernetes.Interface, ns, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		_, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s still in the API server after %v (err %v)", ns, name, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func condition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func createPod(t *testing.T, c kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	if _, err := c.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
}

func agnhostContainer(name string, command []string, args ...string) corev1.Container {
	return corev1.Container{Name: name, Image: agnhostImage, Command: command, Args: args}
}

// execResult is what an exec session returned.
type execResult struct {
	stdout, stderr string
	code           int
	err            error
}

// execDirect runs cmd through the kubelet API itself (no API server), with the SPDY executor,
// or with the websocket one when websocket is set.
func (n *testNode) execDirect(t *testing.T, ns, pod, container string, cmd []string, stdin string, tty, websocket bool) execResult {
	t.Helper()
	q := url.Values{"command": cmd, "output": {"1"}}
	if !tty {
		q.Set("error", "1")
	} else {
		q.Set("tty", "1")
	}
	if stdin != "" {
		q.Set("input", "1")
	}
	u, _ := url.Parse(n.kubeletURL("/exec/"+ns+"/"+pod+"/"+container, q))
	cfg := &rest.Config{Host: "https://" + n.listener.Addr().String(), TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	var ex remotecommand.Executor
	var err error
	if websocket {
		// The API server speaks v5 to clients and translates to SPDY for kubelets that do not
		// declare websocket support; virtual-kubelet's handler serves websocket up to v4.
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(cfg, "GET", u.String(), "v4.channel.k8s.io")
	} else {
		ex, err = remotecommand.NewSPDYExecutor(cfg, "POST", u)
	}
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	opts := remotecommand.StreamOptions{Stdout: &stdout, Tty: tty}
	if !tty {
		opts.Stderr = &stderr
	}
	if stdin != "" {
		opts.Stdin = strings.NewReader(stdin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = ex.StreamWithContext(ctx, opts)
	res := execResult{stdout: stdout.String(), stderr: stderr.String(), err: err}
	var ce utilexec.CodeExitError
	if errors.As(err, &ce) {
		res.code = ce.Code
	} else if err != nil {
		res.code = -1
	}
	return res
}

func httpsGet(t *testing.T, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// readFrom connects from the netns at nsPath to addr and returns what the server sends.
func readFrom(nsPath, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := dialIn(ctx, nsPath, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(conn)
	return string(b), err
}

// httpFrom GETs http://addr/ from the netns at nsPath.
func httpFrom(nsPath, addr string) (string, error) {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, a string) (net.Conn, error) { return dialIn(ctx, nsPath, a) },
		DisableKeepAlives: true,
	}}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestKubelet runs one node against a real kube-apiserver and walks the daemon through what a
// kubelet does: registration, a two-container agnhost pod reached over its CNI address, exec
// and logs through the kubelet API, deletion, an unsupported image, a hostNetwork pod,
// restarts, probes, and Stop leaving nothing behind.
func TestKubelet(t *testing.T) {
	nodeIP := testNodeIP.Addr()
	n, _ := startNode(t, "kl1", []netip.Addr{nodeIP}, testNodeIP, "127.0.0.1:0")
	c := n.client
	ctx := context.Background()
	const ns = "default"

	t.Run("node", func(t *testing.T) {
		node, err := c.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			t.Errorf("node not Ready: %+v", node.Status.Conditions)
		}
		for k, v := range map[string]string{"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "netwarden.io/test": "kubelet"} {
			if node.Labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, node.Labels[k], v)
			}
		}
		if node.Labels["kubernetes.io/arch"] == "" {
			t.Error("no kubernetes.io/arch label")
		}
		want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}, {Type: corev1.NodeHostName, Address: n.name}}
		if fmt.Sprint(node.Status.Addresses) != fmt.Sprint(want) {
			t.Errorf("addresses %v, want %v", node.Status.Addresses, want)
		}
		if node.Spec.PodCIDR != testPodCIDR.String() || len(node.Spec.PodCIDRs) != 1 || node.Spec.PodCIDRs[0] != testPodCIDR.String() {
			t.Errorf("podCIDR %q podCIDRs %v, want %s", node.Spec.PodCIDR, node.Spec.PodCIDRs, testPodCIDR)
		}
		if p := node.Status.Capacity.Pods().Value(); p != MaxPods {
			t.Errorf("capacity pods %d, want %d", p, MaxPods)
		}
		if node.Status.Capacity.Cpu().IsZero() || node.Status.Allocatable.Memory().IsZero() {
			t.Errorf("capacity %v allocatable %v: cpu and memory must be set", node.Status.Capacity, node.Status.Allocatable)
		}
		if ni := node.Status.NodeInfo; ni.KubeletVersion != KubeletVersion || ni.OperatingSystem != "linux" || ni.Architecture == "" {
			t.Errorf("nodeInfo %+v", ni)
		}
		if port := node.Status.DaemonEndpoints.KubeletEndpoint.Port; int(port) != n.listener.Addr().(*net.TCPAddr).Port {
			t.Errorf("kubelet port %d, want the listener's %v", port, n.listener.Addr())
		}
		var lease *coordinationv1.Lease
		eventually(t, 15*time.Second, "the node's Lease", func() (err error) {
			lease, err = c.CoordinationV1().Leases("kube-node-lease").Get(ctx, n.name, metav1.GetOptions{})
			return err
		})
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != n.name || lease.Spec.RenewTime == nil {
			t.Errorf("lease %+v", lease.Spec)
		}
		code, body := httpsGet(t, n.kubeletURL("/healthz", nil))
		if code != http.StatusOK || body != "ok" {
			t.Errorf("/healthz: %d %q", code, body)
		}
	})

	t.Run("pod", func(t *testing.T) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName: n.name,
				Containers: []corev1.Container{
					agnhostContainer("serve", []string{"/bin/bash", "-c", "/agnhost serve-hostname --tcp --http=false --port 80"}),
					{
						Name: "porter", Image: agnhostImage,
						Command: []string{"/bin/sh", "-c", "echo hello from $(POD_NAME) on $(NODE_NAME) && exec /agnhost porter"},
						Env: []corev1.EnvVar{
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "SERVE_PORT_8081", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
						},
					},
				},
			},
		}
		began := time.Now()
		createPod(t, c, pod)
		running := waitPod(t, c, ns, "web", time.Minute, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		toRunning := time.Since(began)
		got := waitPod(t, c, ns, "web", time.Minute, "Ready", podReady)
		t.Logf("pod create -> Running %v, -> Ready %v (Running status seen with %d ready containers)",
			toRunning.Round(time.Millisecond), time.Since(began).Round(time.Millisecond), countReady(running))

		podIP, err := netip.ParseAddr(got.Status.PodIP)
		if err != nil || !testPodCIDR.Contains(podIP) {
			t.Fatalf("pod IP %q not in %s", got.Status.PodIP, testPodCIDR)
		}
		if len(got.Status.PodIPs) != 1 || got.Status.PodIPs[0].IP != got.Status.PodIP {
			t.Errorf("podIPs %v", got.Status.PodIPs)
		}
		if got.Status.HostIP != nodeIP.String() || len(got.Status.HostIPs) != 1 {
			t.Errorf("hostIP %q hostIPs %v, want %s", got.Status.HostIP, got.Status.HostIPs, nodeIP)
		}
		if got.Status.StartTime == nil {
			t.Error("no startTime")
		}
		for _, ct := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady, corev1.PodReadyToStartContainers} {
			if s := condition(got, ct); s != corev1.ConditionTrue {
				t.Errorf("condition %s = %q", ct, s)
			}
		}
		if len(got.Status.ContainerStatuses) != 2 {
			t.Fatalf("container statuses %+v", got.Status.ContainerStatuses)
		}
		for _, cs := range got.Status.ContainerStatuses {
			if !cs.Ready || cs.Started == nil || !*cs.Started || cs.State.Running == nil || cs.State.Running.StartedAt.IsZero() ||
				!strings.HasPrefix(cs.ContainerID, "netwarden://") || !strings.Contains(cs.ImageID, "agnhost@sha256:") || cs.Image != agnhostImage || cs.RestartCount != 0 {
				t.Errorf("container status %+v", cs)
			}
		}
		netnsName := netnsNameFor(n.name, ns, "web", string(got.UID))
		if _, err := os.Stat(filepath.Join(NetNSDir, netnsName)); err != nil {
			t.Errorf("pod netns: %v", err)
		}

		// serve-hostname answers with the pod's hostname: the UTS namespace.
		addr80 := net.JoinHostPort(podIP.String(), "80")
		// Ready without a probe means started, not yet listening: the first tries may be refused.
		eventually(t, 10*time.Second, "TCP "+addr80+" from the node answering \"web\"", func() error {
			reply, err := readFrom(n.netnsPath, addr80)
			if err == nil && reply != "web" {
				err = fmt.Errorf("reply %q", reply)
			}
			return err
		})
		// porter serves the env value resolved from status.podIP.
		addr8081 := net.JoinHostPort(podIP.String(), "8081")
		eventually(t, 10*time.Second, "HTTP "+addr8081+" from the node answering the pod IP", func() error {
			reply, err := httpFrom(n.netnsPath, addr8081)
			if err == nil && reply != podIP.String() {
				err = fmt.Errorf("reply %q", reply)
			}
			return err
		})

		t.Run("exec", func(t *testing.T) {
			for _, ws := range []bool{false, true} {
				proto := map[bool]string{false: "spdy", true: "websocket"}[ws]
				r := n.execDirect(t, ns, "web", "porter", []string{"/agnhost", "connect", addr80, "--timeout=1s", "--protocol=tcp"}, "", false, ws)
				if r.err != nil || r.code != 0 {
					t.Errorf("%s: agnhost connect %s: code %d err %v stdout %q stderr %q", proto, addr80, r.code, r.err, r.stdout, r.stderr)
				}
				bad := net.JoinHostPort(podIP.String(), "81")
				r = n.execDirect(t, ns, "web", "porter", []string{"/agnhost", "connect", bad, "--timeout=1s", "--protocol=tcp"}, "", false, ws)
				if r.code <= 0 {
					t.Errorf("%s: agnhost connect %s (nothing listens): code %d err %v, want a non-zero exit code", proto, bad, r.code, r.err)
				} else {
					t.Logf("%s: failing connect: exit code %d (%v), stderr %q", proto, r.code, r.err, r.stderr)
				}
			}
			r := n.execDirect(t, ns, "web", "serve", []string{"sh", "-c", "hostname; test -x /agnhost && echo agnhost; echo $HOSTNAME; exit 7"}, "", false, false)
			if r.code != 7 || r.stdout != "web\nagnhost\nweb\n" {
				t.Errorf("hostname/rootfs check: code %d stdout %q stderr %q err %v", r.code, r.stdout, r.stderr, r.err)
			}
			// Devices work, the host's files cannot be touched, /dev/shm is the pod's own.
			shm := "nwk-shm-" + string(got.UID)
			r = n.execDirect(t, ns, "web", "serve", []string{"sh", "-c",
				"echo x > /dev/null && touch /tmp/x /dev/shm/" + shm + " && ! touch /usr/nwk-x 2>/dev/null && ! touch /dev/nwk-x 2>/dev/null && ! touch /etc/nwk-x 2>/dev/null"}, "", false, false)
			if r.err != nil {
				t.Errorf("rootfs writability: %+v", r)
			}
			if _, err := os.Stat("/dev/shm/" + shm); err == nil {
				os.Remove("/dev/shm/" + shm)
				t.Errorf("a pod's /dev/shm file reached the host's")
			}
			r = n.execDirect(t, ns, "web", "serve", []string{"/bin/cat"}, "piped through stdin", false, false)
			if r.err != nil || r.stdout != "piped through stdin" {
				t.Errorf("stdin: stdout %q err %v", r.stdout, r.err)
			}
			r = n.execDirect(t, ns, "web", "serve", []string{"/bin/sh", "-c", "test -t 0 && tty"}, "", true, false)
			if r.err != nil || !strings.HasPrefix(r.stdout, "/dev/pts/") {
				t.Errorf("tty: stdout %q err %v", r.stdout, r.err)
			}
			r = n.execDirect(t, ns, "web", "serve", []string{"no-such-command"}, "", false, false)
			if r.err == nil {
				t.Errorf("a missing command ran: %+v", r)
			}
		})

		t.Run("logs", func(t *testing.T) {
			code, body := httpsGet(t, n.kubeletURL("/containerLogs/"+ns+"/web/porter", nil))
			if code != http.StatusOK || body != "hello from web on "+n.name+"\n" {
				t.Errorf("porter logs: %d %q", code, body)
			}
			// serve-hostname logs each connection (the ones made above).
			code, body = httpsGet(t, n.kubeletURL("/containerLogs/"+ns+"/web/serve", url.Values{"timestamps": {"true"}, "tailLines": {"1"}}))
			if code != http.StatusOK || !strings.Contains(body, "TCP request from") || strings.Count(body, "\n") != 1 {
				t.Errorf("serve logs (timestamps, tailLines=1): %d %q", code, body)
			} else if _, err := time.Parse(time.RFC3339Nano, strings.Fields(body)[0]); err != nil {
				t.Errorf("serve logs: no timestamp: %q", body)
			}
			code, body = httpsGet(t, n.kubeletURL("/containerLogs/"+ns+"/web/nope", nil))
			if code != http.StatusNotFound {
				t.Errorf("logs of a missing container: %d %q", code, body)
			}
		})

		t.Run("delete", func(t *testing.T) {
			// serve-hostname sleeps 60 s after SIGTERM: it goes with SIGKILL at the end of the
			// grace period, and only then does the object leave the API server.
			grace := int64(2)
			began := time.Now()
			if err := c.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
				t.Fatal(err)
			}
			waitPodGone(t, c, ns, "web", time.Minute)
			took := time.Since(began)
			t.Logf("pod delete (grace 2s, SIGTERM ignored) -> gone from the API server %v", took.Round(time.Millisecond))
			if took < 2*time.Second {
				t.Errorf("gone after %v, before the grace period", took)
			}
			// virtual-kubelet force-deletes the object itself at the end of the grace period,
			// which can come before the daemon's teardown has finished: wait for it.
			eventually(t, 10*time.Second, "teardown after deletion", func() error {
				if _, err := os.Stat(filepath.Join(NetNSDir, netnsName)); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("pod netns after deletion: %v", err)
				}
				if m, _ := mountsBelow(n.stateDir); len(m) > 0 {
					return fmt.Errorf("mounts after deletion: %v", m)
				}
				if entries, _ := os.ReadDir(filepath.Join(n.stateDir, "pods")); len(entries) > 0 {
					return fmt.Errorf("pod dirs after deletion: %v", entries)
				}
				return nil
			})
			ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			if conn, err := dialIn(ctx, n.netnsPath, addr80); err == nil {
				conn.Close()
				t.Errorf("%s still answers after deletion", addr80)
			}
		})
	})

	t.Run("unsupported-image", func(t *testing.T) {
		createPod(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "nginx", Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{
				{Name: "nginx", Image: "docker.io/library/nginx:1.27"},
				agnhostContainer("pause", nil),
			}},
		})
		got := waitPod(t, c, ns, "nginx", time.Minute, "reporting ImageNotSupported", func(p *corev1.Pod) bool {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "nginx" && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ImageNotSupported" {
					return true
				}
			}
			return false
		})
		for _, cs := range got.Status.ContainerStatuses {
			if cs.Name == "nginx" {
				msg := cs.State.Waiting.Message
				if !strings.Contains(msg, "docker.io/library/nginx:1.27") || !strings.Contains(msg, "agnhost") {
					t.Errorf("message %q should name the image and what is supported", msg)
				}
				t.Logf("nginx: %s: %s", cs.State.Waiting.Reason, msg)
			}
		}
		// The agnhost container runs, but the pod stays Pending as the kubelet's would.
		waitPod(t, c, ns, "nginx", 30*time.Second, "running its agnhost container", func(p *corev1.Pod) bool {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "pause" && cs.State.Running != nil {
					return true
				}
			}
			return false
		})
		time.Sleep(300 * time.Millisecond)
		if p, _ := c.CoreV1().Pods(ns).Get(ctx, "nginx", metav1.GetOptions{}); p.Status.Phase != corev1.PodPending {
			t.Errorf("phase %s, want Pending", p.Status.Phase)
		}
		began := time.Now()
		if err := c.CoreV1().Pods(ns).Delete(ctx, "nginx", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "nginx", time.Minute)
		t.Logf("pod delete (agnhost pause, exits on SIGTERM) -> gone from the API server %v", time.Since(began).Round(time.Millisecond))
	})

	t.Run("host-network", func(t *testing.T) {
		grace := int64(1)
		createPod(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hostnet", Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n.name, HostNetwork: true, TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{
				agnhostContainer("serve", []string{"/agnhost", "serve-hostname", "--tcp", "--http=false", "--port", "9376"}),
			}},
		})
		got := waitPod(t, c, ns, "hostnet", time.Minute, "Ready", podReady)
		if got.Status.PodIP != nodeIP.String() {
			t.Errorf("hostNetwork pod IP %q, want the node IP %s", got.Status.PodIP, nodeIP)
		}
		// It listens in the node's netns, and its hostname is the node's.
		addr := net.JoinHostPort(nodeIP.String(), "9376")
		eventually(t, 10*time.Second, "TCP "+addr+" answering the node name", func() error {
			reply, err := readFrom(n.netnsPath, addr)
			if err == nil && reply != n.name {
				err = fmt.Errorf("reply %q", reply)
			}
			return err
		})
		if err := c.CoreV1().Pods(ns).Delete(ctx, "hostnet", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "hostnet", time.Minute)
	})

	t.Run("restart", func(t *testing.T) {
		createPod(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crash", Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{
				agnhostContainer("crash", []string{"/bin/sh", "-c", "echo attempt; exit 3"}),
			}},
		})
		got := waitPod(t, c, ns, "crash", time.Minute, "restarted twice", func(p *corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2
		})
		cs := got.Status.ContainerStatuses[0]
		if cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 3 {
			t.Errorf("lastState %+v, want terminated with exit code 3", cs.LastTerminationState)
		}
		if got.Status.Phase != corev1.PodRunning {
			t.Errorf("phase %s, want Running (restartPolicy Always)", got.Status.Phase)
		}
		code, body := httpsGet(t, n.kubeletURL("/containerLogs/"+ns+"/crash/crash", url.Values{"previous": {"true"}}))
		if code != http.StatusOK || body != "attempt\n" {
			t.Errorf("previous logs: %d %q", code, body)
		}
		waitPod(t, c, ns, "crash", 30*time.Second, "in CrashLoopBackOff", func(p *corev1.Pod) bool {
			w := p.Status.ContainerStatuses[0].State.Waiting
			return w != nil && w.Reason == "CrashLoopBackOff"
		})
		if err := c.CoreV1().Pods(ns).Delete(ctx, "crash", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "crash", time.Minute)
	})

	t.Run("probes-and-init", func(t *testing.T) {
		grace1 := int64(1) // serve-hostname waits 60 s after SIGTERM
		createPod(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probed", Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:                      n.name,
				TerminationGracePeriodSeconds: &grace1,
				InitContainers: []corev1.Container{
					agnhostContainer("init", []string{"/bin/sh", "-c", "echo initialized"}),
				},
				Containers: []corev1.Container{
					{
						Name: "serve", Image: agnhostImage,
						Args:  []string{"serve-hostname", "--tcp", "--http=false", "--port", "80"},
						Ports: []corev1.ContainerPort{{Name: "tcp", ContainerPort: 80}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("tcp")}},
							PeriodSeconds: 1,
						},
					},
					{
						Name: "gated", Image: agnhostImage,
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
							PeriodSeconds: 1,
						},
					},
				},
			},
		})
		got := waitPod(t, c, ns, "probed", time.Minute, "Running with serve ready", func(p *corev1.Pod) bool {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "serve" && cs.Ready {
					return p.Status.Phase == corev1.PodRunning
				}
			}
			return false
		})
		if s := condition(got, corev1.PodReady); s != corev1.ConditionFalse {
			t.Errorf("Ready %q while the exec probe fails, want False", s)
		}
		if ics := got.Status.InitContainerStatuses; len(ics) != 1 || ics[0].State.Terminated == nil || ics[0].State.Terminated.ExitCode != 0 {
			t.Errorf("init container statuses %+v", ics)
		}
		code, body := httpsGet(t, n.kubeletURL("/containerLogs/"+ns+"/probed/init", nil))
		if code != http.StatusOK || body != "initialized\n" {
			t.Errorf("init container logs: %d %q", code, body)
		}
		// The file that makes the exec probe pass.
		if r := n.execDirect(t, ns, "probed", "gated", []string{"touch", "/tmp/ready"}, "", false, false); r.err != nil {
			t.Errorf("exec: %+v", r)
		}
		waitPod(t, c, ns, "probed", 30*time.Second, "Ready", podReady)
		if err := c.CoreV1().Pods(ns).Delete(ctx, "probed", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "probed", time.Minute)
	})

	t.Run("volumes", func(t *testing.T) {
		if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"greeting": "hi"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		grace := int64(1)
		createPod(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "vols", Namespace: ns, Labels: map[string]string{"app": "vols"}},
			Spec: corev1.PodSpec{
				NodeName: n.name, ServiceAccountName: "sa", TerminationGracePeriodSeconds: &grace,
				Volumes: []corev1.Volume{
					{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
					{Name: "info", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
						{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
						{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
						{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
							{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
							{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}},
						}}},
					}}}},
				},
				Containers: []corev1.Container{
					{Name: "writer", Image: agnhostImage, Command: []string{"/bin/sh", "-c", "echo written > /data/file && exec /agnhost pause"},
						VolumeMounts: []corev1.VolumeMount{{Name: "shared", MountPath: "/data"}}},
					{Name: "reader", Image: agnhostImage, VolumeMounts: []corev1.VolumeMount{
						{Name: "shared", MountPath: "/data"},
						{Name: "cfg", MountPath: "/config"},
						{Name: "info", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"},
					}},
				},
			},
		})
		waitPod(t, c, ns, "vols", time.Minute, "Ready", podReady)
		eventually(t, 10*time.Second, "the writer's file", func() error {
			r := n.execDirect(t, ns, "vols", "reader", []string{"cat", "/data/file", "/config/greeting",
				"/var/run/secrets/kubernetes.io/serviceaccount/labels", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"}, "", false, false)
			if want := "written\nhiapp=\"vols\"default"; r.err != nil || r.stdout != want {
				return fmt.Errorf("stdout %q stderr %q err %v; want %q", r.stdout, r.stderr, r.err, want)
			}
			return nil
		})
		r := n.execDirect(t, ns, "vols", "reader", []string{"sh", "-c", "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && ! touch /config/x 2>/dev/null"}, "", false, false)
		if r.err != nil {
			t.Errorf("token present, configMap volume read-only: %+v", r)
		}
		if err := c.CoreV1().Pods(ns).Delete(ctx, "vols", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "vols", time.Minute)
	})

	t.Run("force-delete-and-recreate", func(t *testing.T) {
		mk := func() *corev1.Pod {
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "again", Namespace: ns},
				Spec:       corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{agnhostContainer("pause", nil)}},
			}
		}
		createPod(t, c, mk())
		old := waitPod(t, c, ns, "again", time.Minute, "Ready", podReady)
		zero := int64(0)
		if err := c.CoreV1().Pods(ns).Delete(ctx, "again", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		createPod(t, c, mk())
		got := waitPod(t, c, ns, "again", time.Minute, "Ready as a new pod", func(p *corev1.Pod) bool { return p.UID != old.UID && podReady(p) })
		if got.Status.PodIP == old.Status.PodIP {
			t.Logf("the new pod got the old one's IP %s back", got.Status.PodIP)
		}
		oldNS := filepath.Join(NetNSDir, netnsNameFor(n.name, ns, "again", string(old.UID)))
		eventually(t, 30*time.Second, "the force-deleted pod's netns to go", func() error {
			if _, err := os.Stat(oldNS); err == nil {
				return fmt.Errorf("%s still there", oldNS)
			}
			return nil
		})
		if _, err := os.Stat(filepath.Join(NetNSDir, netnsNameFor(n.name, ns, "again", string(got.UID)))); err != nil {
			t.Errorf("the new pod's netns: %v", err)
		}
		if err := c.CoreV1().Pods(ns).Delete(ctx, "again", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "again", time.Minute)
	})

	t.Run("many-pods", func(t *testing.T) {
		const count = 20
		began := time.Now()
		for i := range count {
			createPod(t, c, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("many-%d", i), Namespace: ns},
				Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{
					agnhostContainer("porter", []string{"/agnhost", "porter"}),
				}},
			})
		}
		ips := map[string]bool{}
		for i := range count {
			p := waitPod(t, c, ns, fmt.Sprintf("many-%d", i), time.Minute, "Ready", podReady)
			if ips[p.Status.PodIP] {
				t.Errorf("pod IP %s given twice", p.Status.PodIP)
			}
			ips[p.Status.PodIP] = true
		}
		t.Logf("%d pods created at once -> all Ready in %v", count, time.Since(began).Round(time.Millisecond))
		began = time.Now()
		for i := range count {
			if err := c.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("many-%d", i), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range count {
			waitPodGone(t, c, ns, fmt.Sprintf("many-%d", i), time.Minute)
		}
		t.Logf("%d pods deleted at once -> all gone in %v", count, time.Since(began).Round(time.Millisecond))
		eventually(t, 10*time.Second, "the pods' directories to go", func() error {
			if entries, _ := os.ReadDir(filepath.Join(n.stateDir, "pods")); len(entries) > 0 {
				return fmt.Errorf("pod dirs left: %d", len(entries))
			}
			return nil
		})
	})

	t.Run("stop", func(t *testing.T) {
		// A pod still running at Stop is killed and its sandbox removed; its object stays.
		createPod(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "left", Namespace: ns},
			Spec:       corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{agnhostContainer("pause", nil)}},
		})
		waitPod(t, c, ns, "left", time.Minute, "Ready", podReady)
		began := time.Now()
		if err := n.d.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		t.Logf("Stop with one pod took %v", time.Since(began).Round(time.Millisecond))
		n.assertNoLeftovers(t)
		if _, err := c.CoreV1().Pods(ns).Get(ctx, "left", metav1.GetOptions{}); err != nil {
			t.Errorf("the pod object should stay after Stop: %v", err)
		}
		if _, err := c.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{}); err != nil {
			t.Errorf("the node object should stay after Stop: %v", err)
		}
	})
}

// eventually retries fn until it returns nil, failing the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countReady(p *corev1.Pod) int {
	n := 0
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Ready {
			n++
		}
	}
	return n
}

// TestThroughAPIServer reaches the kubelet API as users do, through the API server: kubectl
// exec (websocket v5 to the API server, which translates it to SPDY for the kubelet), client-go's
// SPDY executor on pods/exec, and kubectl logs. The node's InternalIP is 127.0.0.1 and its
// listener is on the host's loopback, where the API server can reach it.
func TestThroughAPIServer(t *testing.T) {
	n, srv := startNode(t, "kl2", []netip.Addr{netip.MustParseAddr("127.0.0.1")}, netip.Prefix{}, "127.0.0.1:0",
		"--kubelet-preferred-address-types=InternalIP")
	kubectl := kubetest.Binary(t, "kubectl")
	kubeconfig := srv.Kubeconfig(t, "")
	c := n.client
	ctx := context.Background()
	grace := int64(1)
	createPod(t, c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: n.name, TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{
			agnhostContainer("serve", []string{"/bin/bash", "-c", "/agnhost serve-hostname --tcp --http=false --port 80"}),
		}},
	})
	createPod(t, c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: n.name, TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{
			agnhostContainer("pause", nil),
		}},
	})
	target := waitPod(t, c, "default", "target", time.Minute, "Ready", podReady)
	waitPod(t, c, "default", "client", time.Minute, "Ready", podReady)
	addr := net.JoinHostPort(target.Status.PodIP, "80")
	bad := net.JoinHostPort(target.Status.PodIP, "81")

	run := func(args ...string) (string, int) {
		cmd := exec.Command(kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("kubectl %v: %v", args, err)
		}
		return string(out), 0
	}
	// Pod to pod over the bridge, from inside the client pod.
	eventually(t, 10*time.Second, "kubectl exec: agnhost connect "+addr, func() error {
		if out, code := run("exec", "client", "--", "/agnhost", "connect", addr, "--timeout=1s", "--protocol=tcp"); code != 0 {
			return fmt.Errorf("exit code %d: %s", code, out)
		}
		return nil
	})
	out, code := run("exec", "client", "--", "/agnhost", "connect", bad, "--timeout=1s", "--protocol=tcp")
	if code == 0 {
		t.Errorf("kubectl exec: agnhost connect %s succeeded: %s", bad, out)
	}
	t.Logf("kubectl exec of a failing connect: exit code %d, %q", code, out)
	if out, code := run("exec", "target", "--", "sh", "-c", "exit 42"); code != 42 {
		t.Errorf("kubectl exec exit 42: exit code %d, %q", code, out)
	}
	if out, code := run("exec", "target", "--", "hostname"); code != 0 || out != "target\n" {
		t.Errorf("kubectl exec hostname: %d %q", code, out)
	}

	// client-go's SPDY executor on pods/exec.
	cfg := srv.AdminConfig()
	rc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{{addr, true}, {bad, false}} {
		req := rc.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name("client").SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{
				Container: "pause", Command: []string{"/agnhost", "connect", tc.addr, "--timeout=1s", "--protocol=tcp"},
				Stdout: true, Stderr: true,
			}, scheme.ParameterCodec)
		ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
		var ce utilexec.CodeExitError
		switch {
		case tc.ok && err != nil:
			t.Errorf("client-go SPDY exec connect %s: %v (stderr %q)", tc.addr, err, stderr.String())
		case !tc.ok && (!errors.As(err, &ce) || ce.Code == 0):
			t.Errorf("client-go SPDY exec connect %s: %v, want an exit code error", tc.addr, err)
		}
	}

	// kubectl logs: serve-hostname logged the connections.
	if out, code := run("logs", "target"); code != 0 || !strings.Contains(out, "TCP request from") {
		t.Errorf("kubectl logs: %d %q", code, out)
	}
	for _, name := range []string{"target", "client"} {
		if err := c.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitPodGone(t, c, "default", "target", time.Minute)
	waitPodGone(t, c, "default", "client", time.Minute)
}
