// Package kubelet is a node daemon for test clusters that run without a container engine: it
// stands in for the kubelet of one node, registering the Node and keeping it Ready with a Lease,
// and running the pods bound to it as network namespaces with real processes in them.
//
// It is built on the virtual-kubelet library: node/nodeutil registers the Node, renews its
// Lease and drives the pods through the provider here, and node/api serves the kubelet API
// (exec, containerLogs) on Config.Listener.
//
// A pod is a network namespace under /var/run/netns, attached through libcni with Config's
// conflist (hostNetwork pods use the node's namespace and get no CNI call), a UTS namespace
// whose hostname is the pod's, and a root filesystem made of read-only bind mounts of the
// host's /usr, /bin, /lib, /lib64, /sbin and /etc with the agnhost binary at /agnhost. Only the
// agnhost image runs: its containers' commands are built against the image's ENTRYPOINT
// ["/agnhost"] and CMD ["pause"] and run chrooted in that tree. Containers of other images wait
// with reason ImageNotSupported. Init containers run in order, containers restart by the pod's
// restart policy with a back-off, startup/readiness/liveness probes (exec, tcpSocket, httpGet)
// run from the node's network namespace, and emptyDir, configMap, secret, downwardAPI and
// projected volumes are written once when the pod starts. The containers of a pod share its
// root filesystem (and so each other's volume mounts and /tmp), and run as root in the host's
// PID namespace, each in a process group of its own.
//
// Everything the daemon makes outside its StateDir (named network namespaces) and every mount it
// makes is removed when a pod goes away and on Stop.
package kubelet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// KubeletVersion is what the Node reports as status.nodeInfo.kubeletVersion: the Kubernetes
// release whose API this daemon speaks.
const KubeletVersion = "v1.37.2"

// MaxPods is the node's pods capacity, the kubelet's default.
const MaxPods = 110

// Config configures Start.
type Config struct {
	// NodeName is the Node's name (and the hostname of its hostNetwork pods).
	NodeName string
	// Client talks to the API server. It needs the rights of a kubelet over its Node, Lease and
	// pods, and to list Secrets, ConfigMaps and Services (virtual-kubelet watches them).
	Client kubernetes.Interface
	// NodeNetNS is the path of the node's network namespace, e.g. /var/run/netns/x. The caller
	// creates and removes it. CNI plugins run in it, and so do hostNetwork pods and probes.
	NodeNetNS string
	// NodeIPs are the node's InternalIP addresses (inside NodeNetNS). The first one's family is
	// the primary one: pod IPs of that family are listed first.
	NodeIPs []netip.Addr
	// PodCIDRs become spec.podCIDR and spec.podCIDRs. The conflist's IPAM decides the pod IPs.
	PodCIDRs []netip.Prefix
	// Labels are extra Node labels; kubernetes.io/hostname, kubernetes.io/os and
	// kubernetes.io/arch are always set.
	Labels map[string]string
	// Listener is where the kubelet API is served, over TLS with a self-signed certificate (the
	// API server does not verify kubelets unless told to). Its port goes into
	// status.daemonEndpoints.kubeletEndpoint. The caller creates it, in whatever network
	// namespace the API server reaches; Stop closes it.
	Listener net.Listener
	// CNIConfList is a CNI network configuration list (JSON), run through libcni for every pod
	// that is not hostNetwork: ADD when it starts, DEL when it goes away. The capability
	// portMappings carries the containers' hostPorts.
	CNIConfList []byte
	// CNIBinDirs are searched for the CNI plugins.
	CNIBinDirs []string
	// Agnhost is the path of the agnhost binary (k8s.io/kubernetes/test/images/agnhost), which
	// containers see as /agnhost.
	Agnhost string
	// StateDir holds the node's pod root filesystems, container logs and CNI cache. It is
	// created if missing; use one per node.
	StateDir string
	// Logf receives the daemon's log lines; nil discards them.
	Logf func(format string, args ...any)
}

// Daemon is a running node daemon.
type Daemon struct {
	cfg      Config
	cni      *libcni.CNIConfig
	cniList  *libcni.NetworkConfigList
	spawner  *spawner
	provider *provider
	vk       *nodeutil.Node
	cancel   context.CancelFunc
	server   *http.Server
	served   chan struct{}
	logs     *guardedLog

	imageIDOnce sync.Once
	imageID     string

	stopOnce sync.Once
	stopErr  error
}

// Start registers the Node, keeps it Ready with a Lease in kube-node-lease and runs the pods
// bound to it until Stop. ctx bounds the start only. It returns once the Node is registered
// and the pod controller watches its pods.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	logs := &guardedLog{logf: cfg.Logf}
	cfg.Logf = logs.Logf
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "pods"), 0o755); err != nil {
		return nil, fmt.Errorf("kubelet %s: state dir: %w", cfg.NodeName, err)
	}
	list, err := libcni.ConfListFromBytes(cfg.CNIConfList)
	if err != nil {
		return nil, fmt.Errorf("kubelet %s: CNI conflist: %w", cfg.NodeName, err)
	}
	d := &Daemon{
		cfg: cfg,
		// An explicit exec: libcni makes its default one lazily, racing when pods start together.
		cni: libcni.NewCNIConfigWithCacheDir(cfg.CNIBinDirs, filepath.Join(cfg.StateDir, "cni-cache"), &invoke.DefaultExec{
			RawExec:       &invoke.RawExec{Stderr: logfWriter{cfg.Logf, "kubelet " + cfg.NodeName + ": CNI plugin: "}},
			PluginDecoder: version.PluginDecoder{},
		}),
		cniList: list,
		served:  make(chan struct{}),
		logs:    logs,
	}
	if d.spawner, err = newSpawner(); err != nil {
		return nil, fmt.Errorf("kubelet %s: %w", cfg.NodeName, err)
	}
	d.provider = newProvider(d)
	// The image ID is a digest of the agnhost binary: made now, not under the first pod's lock.
	go d.agnhostImageID("")

	nodeObj, err := d.nodeObject()
	if err != nil {
		d.spawner.close()
		return nil, err
	}
	vk, err := nodeutil.NewNode(cfg.NodeName,
		func(nodeutil.ProviderConfig) (nodeutil.Provider, vknode.NodeProvider, error) {
			return d.provider, nodeProvider{}, nil
		},
		func(c *nodeutil.NodeConfig) error {
			c.Client = cfg.Client
			c.NodeSpec = *nodeObj
			// The handler is served on Config.Listener by serveAPI: nodeutil would listen itself.
			c.TLSConfig = nil
			c.Handler = nil
			// Env is resolved by the daemon, which knows the pod IP that status.podIP refers to.
			c.SkipDownwardAPIResolution = true
			c.NumWorkers = 4
			return nil
		},
		nodeutil.WithPodControllerConfigOverrides(func(pc *vknode.PodControllerConfig) error {
			pc.PodClient = podsGetter{PodsGetter: pc.PodClient, pr: d.provider}
			return nil
		}),
	)
	if err != nil {
		d.spawner.close()
		return nil, fmt.Errorf("kubelet %s: virtual-kubelet node: %w", cfg.NodeName, err)
	}
	d.vk = vk

	runCtx, cancel := context.WithCancel(context.Background())
	runCtx = vklog.WithLogger(runCtx, &logAdapter{logf: cfg.Logf, prefix: "kubelet " + cfg.NodeName + ": "})
	d.cancel = cancel
	go func() {
		if err := vk.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			cfg.Logf("kubelet %s: virtual-kubelet stopped: %v", cfg.NodeName, err)
		}
	}()
	if err := d.serveAPI(); err != nil {
		cancel()
		<-vk.Done()
		d.spawner.close()
		return nil, err
	}
	if err := vk.WaitReady(ctx, 0); err != nil {
		_ = d.Stop()
		return nil, fmt.Errorf("kubelet %s: waiting for the node and pod controllers: %w", cfg.NodeName, err)
	}
	cfg.Logf("kubelet %s: node registered, kubelet API on %s", cfg.NodeName, cfg.Listener.Addr())
	return d, nil
}

// Stop stops every pod's processes (SIGTERM, then SIGKILL after at most stopGrace), deletes
// their CNI attachments, network namespaces and mounts, and stops serving. It leaves the Node
// and the pod objects in the API server, as a stopped kubelet does. Later calls return the
// first one's result.
func (d *Daemon) Stop() error {
	d.stopOnce.Do(func() {
		d.cancel()
		<-d.vk.Done()
		errs := d.provider.stopAll(stopGrace)
		if d.server != nil {
			_ = d.server.Close()
			<-d.served
		}
		d.spawner.close()
		d.stopErr = errors.Join(errs...)
		d.logs.close()
	})
	return d.stopErr
}

// guardedLog drops the lines that goroutines of the libraries (event broadcasting, informers)
// would still log after Stop: a test's t.Logf panics once the test has ended.
type guardedLog struct {
	mu     sync.RWMutex
	closed bool
	logf   func(string, ...any)
}

func (g *guardedLog) Logf(format string, args ...any) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if !g.closed {
		g.logf(format, args...)
	}
}

func (g *guardedLog) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// stopGrace caps the grace period of the pods killed by Stop: a test's teardown should not wait
// a pod's 30 seconds.
const stopGrace = 3 * time.Second

func (c *Config) validate() error {
	var problems []string
	if c.NodeName == "" {
		problems = append(problems, "NodeName is empty")
	}
	if c.Client == nil {
		problems = append(problems, "Client is nil")
	}
	if c.NodeNetNS == "" {
		problems = append(problems, "NodeNetNS is empty")
	} else if _, err := os.Stat(c.NodeNetNS); err != nil {
		problems = append(problems, "NodeNetNS: "+err.Error())
	}
	if len(c.NodeIPs) == 0 {
		problems = append(problems, "NodeIPs is empty")
	}
	if c.Listener == nil {
		problems = append(problems, "Listener is nil")
	} else if _, ok := c.Listener.Addr().(*net.TCPAddr); !ok {
		problems = append(problems, fmt.Sprintf("Listener is not TCP (%v)", c.Listener.Addr()))
	}
	if len(c.CNIConfList) == 0 {
		problems = append(problems, "CNIConfList is empty")
	}
	if c.Agnhost == "" {
		problems = append(problems, "Agnhost is empty")
	} else if fi, err := os.Stat(c.Agnhost); err != nil {
		problems = append(problems, "Agnhost: "+err.Error())
	} else if fi.IsDir() || fi.Mode()&0o111 == 0 {
		problems = append(problems, "Agnhost "+c.Agnhost+" is not an executable file")
	}
	if c.StateDir == "" {
		problems = append(problems, "StateDir is empty")
	}
	if len(problems) > 0 {
		return fmt.Errorf("kubelet config for node %q: %s", c.NodeName, strings.Join(problems, "; "))
	}
	return nil
}

// nodeObject is the Node as registered: virtual-kubelet creates it as is and keeps its
// status's heartbeats fresh.
func (d *Daemon) nodeObject() (*corev1.Node, error) {
	cfg := d.cfg
	lbls := map[string]string{}
	for k, v := range cfg.Labels {
		lbls[k] = v
	}
	lbls[corev1.LabelHostname] = cfg.NodeName
	lbls[corev1.LabelOSStable] = "linux"
	lbls[corev1.LabelArchStable] = runtime.GOARCH
	if _, err := labels.ValidatedSelectorFromSet(lbls); err != nil { // a bad label fails here, not in a retry loop
		return nil, fmt.Errorf("kubelet %s: node labels: %w", cfg.NodeName, err)
	}

	var addrs []corev1.NodeAddress
	for _, ip := range cfg.NodeIPs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: cfg.NodeName})

	var cidrs []string
	for _, p := range cfg.PodCIDRs {
		cidrs = append(cidrs, p.Masked().String())
	}
	var podCIDR string
	if len(cidrs) > 0 {
		podCIDR = cidrs[0]
	}

	resources := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(MaxPods, resource.DecimalSI),
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.StateDir, &st); err == nil {
		resources[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(st.Blocks)*st.Bsize, resource.BinarySI)
	}

	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	// Several nodes share this machine: their ids derive from the name so that they differ.
	id := sha256.Sum256([]byte("netwarden-kubelet/" + cfg.NodeName))
	uuid := hex.EncodeToString(id[:16])
	kernel, osImage := kernelAndOS()

	port := cfg.Listener.Addr().(*net.TCPAddr).Port
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, Labels: lbls},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: cidrs},
		Status: corev1.NodeStatus{
			Capacity:    resources,
			Allocatable: resources.DeepCopy(),
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
			},
			Addresses:       addrs,
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID:               uuid,
				SystemUUID:              fmt.Sprintf("%s-%s-%s-%s-%s", uuid[0:8], uuid[8:12], uuid[12:16], uuid[16:20], uuid[20:32]),
				BootID:                  readTrim("/proc/sys/kernel/random/boot_id"),
				KernelVersion:           kernel,
				OSImage:                 osImage,
				ContainerRuntimeVersion: "netwarden-kubelet://" + KubeletVersion,
				KubeletVersion:          KubeletVersion,
				OperatingSystem:         "linux",
				Architecture:            runtime.GOARCH,
			},
		},
	}, nil
}

// nodeProvider keeps the Node Ready: the daemon has no condition that could make it otherwise
// while it runs.
type nodeProvider struct{}

func (nodeProvider) Ping(context.Context) error                                { return nil }
func (nodeProvider) NotifyNodeStatus(context.Context, func(node *corev1.Node)) {}

// serveAPI serves the kubelet API on the configured listener: virtual-kubelet's handlers for
// exec, attach, containerLogs, portForward and pods, and /healthz.
func (d *Daemon) serveAPI() error {
	cert, err := selfSignedCert(d.cfg.NodeName, d.cfg.NodeIPs)
	if err != nil {
		return fmt.Errorf("kubelet %s: serving certificate: %w", d.cfg.NodeName, err)
	}
	p := d.provider
	pods := api.PodHandler(api.PodHandlerConfig{
		RunInContainer:        p.RunInContainer,
		AttachToContainer:     p.AttachToContainer,
		GetContainerLogs:      p.GetContainerLogs,
		GetPods:               p.GetPods,
		GetPodsFromKubernetes: p.GetPods,
		StreamIdleTimeout:     4 * time.Hour, // as the kubelet's default: an idle kubectl exec stays open
		StreamCreationTimeout: 30 * time.Second,
	}, true)
	mux := http.NewServeMux()
	healthz := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/healthz/", healthz)
	mux.Handle("/", pods)
	d.server = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(logfWriter{d.cfg.Logf, "kubelet " + d.cfg.NodeName + ": kubelet API: "}, "", 0),
	}
	tl := tls.NewListener(d.cfg.Listener, &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// SPDY streaming needs HTTP/1.1 upgrades.
		NextProtos: []string{"http/1.1"},
	})
	go func() {
		defer close(d.served)
		if err := d.server.Serve(tl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.cfg.Logf("kubelet %s: kubelet API server: %v", d.cfg.NodeName, err)
		}
	}()
	return nil
}

func selfSignedCert(name string, ips []netip.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		DNSNames:              []string{name, "localhost"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	tmpl.IPAddresses = append(tmpl.IPAddresses, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// agnhostImageID is the imageID reported for agnhost containers: the digest of the binary that
// stands for the image.
func (d *Daemon) agnhostImageID(image string) string {
	d.imageIDOnce.Do(func() {
		f, err := os.Open(d.cfg.Agnhost)
		if err != nil {
			return
		}
		defer f.Close()
		h := sha256.New()
		buf := make([]byte, 1<<20)
		for {
			n, err := f.Read(buf)
			h.Write(buf[:n])
			if err != nil {
				break
			}
		}
		d.imageID = hex.EncodeToString(h.Sum(nil))
	})
	if d.imageID == "" {
		return ""
	}
	return imageRepo(image) + "@sha256:" + d.imageID
}

func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func kernelAndOS() (kernel, osImage string) {
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	osImage = "Linux"
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				osImage = strings.Trim(v, `"`)
			}
		}
	}
	return kernel, osImage
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

// logfWriter turns the lines of a log.Logger into Logf calls.
type logfWriter struct {
	logf   func(string, ...any)
	prefix string
}

func (w logfWriter) Write(p []byte) (int, error) {
	w.logf("%s%s", w.prefix, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// logAdapter routes virtual-kubelet's log lines (info and above) to Config.Logf.
type logAdapter struct {
	logf   func(string, ...any)
	prefix string
	fields string
}

func (l *logAdapter) out(level, msg string) { l.logf("%s%s%s%s", l.prefix, level, msg, l.fields) }
func (l *logAdapter) Debug(...any)          {}
func (l *logAdapter) Debugf(string, ...any) {}
func (l *logAdapter) Info(a ...any)         { l.out("", fmt.Sprint(a...)) }
func (l *logAdapter) Infof(f string, a ...any) {
	l.out("", fmt.Sprintf(f, a...))
}
func (l *logAdapter) Warn(a ...any)             { l.out("warning: ", fmt.Sprint(a...)) }
func (l *logAdapter) Warnf(f string, a ...any)  { l.out("warning: ", fmt.Sprintf(f, a...)) }
func (l *logAdapter) Error(a ...any)            { l.out("error: ", fmt.Sprint(a...)) }
func (l *logAdapter) Errorf(f string, a ...any) { l.out("error: ", fmt.Sprintf(f, a...)) }
func (l *logAdapter) Fatal(a ...any)            { l.out("fatal: ", fmt.Sprint(a...)) }
func (l *logAdapter) Fatalf(f string, a ...any) { l.out("fatal: ", fmt.Sprintf(f, a...)) }
func (l *logAdapter) WithField(k string, v any) vklog.Logger {
	return l.WithFields(vklog.Fields{k: v})
}
func (l *logAdapter) WithFields(f vklog.Fields) vklog.Logger {
	n := *l
	for k, v := range f {
		switch k { // span attributes that repeat on every line add nothing readable
		case "method", "uid", "phase", "reason", "sleepTime":
			continue
		}
		n.fields += fmt.Sprintf(" %s=%v", k, v)
	}
	return &n
}
func (l *logAdapter) WithError(err error) vklog.Logger {
	return l.WithFields(vklog.Fields{"error": err})
}
