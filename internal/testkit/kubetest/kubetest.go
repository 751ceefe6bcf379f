// Package kubetest runs a real etcd and kube-apiserver on loopback for integration tests.
//
// The binaries are built from Go modules by hack/kube-binaries.sh (`make kube-binaries`) and found
// through Options.BinDir, the KUBE_BIN_DIR environment variable, or the script's default cache
// directory. When they are missing the test is skipped, or fails when the CI environment variable
// is set.
//
// Start gives each test its own etcd and kube-apiserver, listening on free ports of 127.0.0.1, with
// a generated serving certificate, a static admin token (group system:masters), RBAC authorization
// and service-account token signing. No controller manager, scheduler or kubelet runs: namespaces
// are never finalized once deleted, pods stay Pending until a test sets their status (see
// SetPodRunning), and pods bound to a node are only removed by a forced delete (see DeletePodNow).
// The ServiceAccount admission plugin is disabled, so pods can be created in namespaces that have no
// "default" service account.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// EnvBinDir names the environment variable that holds the directory of the kube-apiserver and etcd
// binaries.
const EnvBinDir = "KUBE_BIN_DIR"

// EnvVerbose, when set to a non-empty value, streams the etcd and kube-apiserver logs to stderr as
// they are written. Otherwise they are kept in memory and logged only when the test fails.
const EnvVerbose = "KUBETEST_VERBOSE"

// ServiceAccountIssuer is the issuer of the service-account tokens that the API server signs.
const ServiceAccountIssuer = "https://kubernetes.default.svc"

// ServiceClusterIPRange is the API server's service IP range. It is only a configuration value:
// nothing routes it.
const ServiceClusterIPRange = "10.96.0.0/16"

const (
	readyTimeout = 2 * time.Minute // generous: the test binaries of other packages may share the 2 cores
	stopTimeout  = 15 * time.Second
	logLimit     = 4 << 20 // bytes of each process's log kept in memory
)

// Options configures Start.
type Options struct {
	// BinDir holds the kube-apiserver and etcd binaries. Empty means $KUBE_BIN_DIR, and when that
	// is unset, the directory where hack/kube-binaries.sh puts them by default.
	BinDir string
	// ExtraAPIServerArgs are appended to the kube-apiserver command line (later flags win).
	ExtraAPIServerArgs []string
}

// Server is a running etcd and kube-apiserver pair. Its methods are not safe for concurrent use,
// except AdminConfig, Kubeconfig and CreateServiceAccountToken.
type Server struct {
	// URL is the API server's address, https://127.0.0.1:<port>. It stays the same across Restart.
	URL string
	// CACert is the PEM bundle that verifies the API server's self-signed serving certificate.
	CACert []byte
	// AdminToken is a bearer token of user "admin" in group system:masters.
	AdminToken string
	// EtcdURL is etcd's client address, http://127.0.0.1:<port>.
	EtcdURL string
	// Dir is the temporary directory with the certificates, keys, token file and etcd data.
	Dir string
	// StartupTime is how long the last start of kube-apiserver took until /readyz answered ok.
	StartupTime time.Duration

	binDir      string
	port        int
	apiArgs     []string
	etcd        *process
	apiserver   *process
	etcdLogs    *LogBuffer
	apiLogs     *LogBuffer
	apiStartups int
}

// Start runs etcd and kube-apiserver for the test and waits until the API server is ready. It skips
// the test (or, when $CI is set, fails it) if the binaries are missing. t.Cleanup stops both
// processes and removes their files.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	binDir := findBinDir(t, opts.BinDir, "etcd", "kube-apiserver")

	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		s, err := start(t, binDir, opts)
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			break
		}
		t.Logf("kubetest: %v; retrying with other ports", err)
	}
	t.Fatalf("kubetest: %v", lastErr)
	return nil
}

var errPortTaken = errors.New("a port was taken before the server could bind it")

func start(t testing.TB, binDir string, opts Options) (_ *Server, err error) {
	dir := t.TempDir()
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	s := &Server{
		Dir:      dir,
		binDir:   binDir,
		port:     ports[2],
		URL:      "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2])),
		EtcdURL:  "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		etcdLogs: NewLogBuffer("etcd"),
		apiLogs:  NewLogBuffer("kube-apiserver"),
	}
	defer func() {
		if err != nil {
			s.Stop() // before another attempt
		}
	}()
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("kubetest: etcd log:\n%s", s.etcdLogs.String())
			t.Logf("kubetest: kube-apiserver log:\n%s", s.apiLogs.String())
		}
	})

	if s.AdminToken, err = randomToken(); err != nil {
		return nil, err
	}
	if err := s.writeConfig(); err != nil {
		return nil, err
	}

	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	began := time.Now()
	s.etcd, err = startProcess(filepath.Join(binDir, "etcd"), []string{
		"--name=kubetest",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + s.EtcdURL,
		"--advertise-client-urls=" + s.EtcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubetest=" + peerURL,
		"--unsafe-no-fsync",
		"--log-level=warn",
	}, s.etcdLogs)
	if err != nil {
		return nil, err
	}
	if err := s.waitEtcd(); err != nil {
		return nil, err
	}
	t.Logf("kubetest: etcd %s ready in %v", s.EtcdURL, time.Since(began).Round(time.Millisecond))

	s.apiArgs = append([]string{
		"--etcd-servers=" + s.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		// Without a controller manager the "default" service account is never created, which
		// this plugin requires of every pod.
		"--disable-admission-plugins=ServiceAccount",
		// The advertise address is loopback: the kubernetes Service gets no endpoints.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		// On SIGTERM, close open watches after 2s (answering new requests with 429 and
		// Retry-After meanwhile) instead of waiting up to --request-timeout (1m) for them.
		"--shutdown-send-retry-after=true",
		"--profiling=false",
	}, opts.ExtraAPIServerArgs...)
	if err := s.startAPIServer(); err != nil {
		return nil, err
	}
	t.Logf("kubetest: kube-apiserver %s ready in %v", s.URL, s.StartupTime.Round(time.Millisecond))
	return s, nil
}

// AdminConfig returns a client configuration with the admin token. Each call returns a new Config.
func (s *Server) AdminConfig() *rest.Config {
	return s.Config(s.AdminToken)
}

// Config returns a client configuration that authenticates with the given bearer token.
func (s *Server) Config(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: bytes.Clone(s.CACert)},
		QPS:             500,
		Burst:           1000,
		// No Timeout: it would also cut watches (informers) short.
	}
}

// AdminClient returns a clientset with the admin token.
func (s *Server) AdminClient(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(s.AdminConfig())
	if err != nil {
		t.Fatalf("kubetest: admin client: %v", err)
	}
	return c
}

// Kubeconfig writes a kubeconfig file that authenticates with token (the admin token when empty)
// into a temporary directory of t and returns its path.
func (s *Server) Kubeconfig(t testing.TB, token string) string {
	t.Helper()
	if token == "" {
		token = s.AdminToken
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: bytes.Clone(s.CACert)}
	cfg.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest", Namespace: corev1.NamespaceDefault}
	cfg.CurrentContext = "kubetest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("kubetest: writing kubeconfig: %v", err)
	}
	return path
}

// CreateServiceAccountToken creates the namespace and the service account name in it unless they
// exist, and returns a token for that service account from the TokenRequest API, valid for an hour.
// The service account has no permissions until the test binds it a role.
func (s *Server) CreateServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kubernetes.NewForConfig(s.AdminConfig())
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	if err := EnsureNamespace(ctx, c, namespace, nil); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: creating service account %s/%s: %v", namespace, name, err)
	}
	expiry := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: requesting a token for service account %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// StopAPIServer stops kube-apiserver gracefully (etcd keeps running): it answers requests with 429
// and closes the open watches within about 2 seconds, then exits. Clients get connection errors
// until StartAPIServer.
func (s *Server) StopAPIServer() {
	if s.apiserver != nil {
		s.apiserver.stop(stopTimeout)
		s.apiserver = nil
	}
}

// KillAPIServer kills kube-apiserver with SIGKILL, as a crash would (etcd keeps running).
func (s *Server) KillAPIServer() {
	if s.apiserver != nil {
		s.apiserver.stop(0)
		s.apiserver = nil
	}
}

// StartAPIServer starts kube-apiserver again on the same port, with the same etcd, certificates and
// keys, and waits until it is ready. It does nothing if kube-apiserver is running.
func (s *Server) StartAPIServer(t testing.TB) {
	t.Helper()
	if s.apiserver != nil {
		return
	}
	if s.etcd == nil {
		t.Fatal("kubetest: StartAPIServer after Stop")
	}
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = s.startAPIServer(); !errors.Is(err, errPortTaken) {
			break
		}
		// The port may still be held by a connection of the previous process.
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("kubetest: restarting kube-apiserver: %v", err)
	}
	t.Logf("kubetest: kube-apiserver %s ready again in %v", s.URL, s.StartupTime.Round(time.Millisecond))
}

// Restart stops kube-apiserver and starts it again on the same port with the same etcd.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.StopAPIServer()
	s.StartAPIServer(t)
}

// Stop stops kube-apiserver and etcd; the Server cannot be started again. It is called by the
// test's cleanup; later calls do nothing.
func (s *Server) Stop() {
	s.StopAPIServer()
	if s.etcd != nil {
		s.etcd.stop(stopTimeout)
		s.etcd = nil
	}
}

// Logs returns the kube-apiserver log kept in memory (all starts).
func (s *Server) Logs() string { return s.apiLogs.String() }

func (s *Server) startAPIServer() error {
	s.apiStartups++
	if s.apiStartups > 1 {
		fmt.Fprintf(s.apiLogs, "----- kubetest: kube-apiserver start #%d -----\n", s.apiStartups)
	}
	began := time.Now()
	p, err := startProcess(filepath.Join(s.binDir, "kube-apiserver"), s.apiArgs, s.apiLogs)
	if err != nil {
		return err
	}
	if err := s.waitAPIServer(p); err != nil {
		p.stop(stopTimeout)
		return err
	}
	s.apiserver = p
	s.StartupTime = time.Since(began)
	return nil
}

func (s *Server) writeConfig() error {
	// Static token file: token,user,uid,"groups".
	tokens := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n", s.AdminToken)
	if err := os.WriteFile(filepath.Join(s.Dir, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(s.Dir, "sa.key"), priv, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func (s *Server) waitEtcd() error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(readyTimeout)
	for {
		if exited, err := s.etcd.exited(); exited {
			return exitError("etcd", err, s.etcdLogs)
		}
		resp, err := client.Get(s.EtcdURL + "/health")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"health":"true"`)) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after %v (last error: %v); its log follows the test's", readyTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAPIServer polls /readyz with the admin token until it answers ok. The serving certificate is
// generated by kube-apiserver at startup (or reused from the cert dir on a restart); it is read once
// it exists, and the connection is verified with it.
func (s *Server) waitAPIServer(p *process) error {
	certFile := filepath.Join(s.Dir, "certs", "apiserver.crt")
	deadline := time.Now().Add(readyTimeout)
	var client *http.Client
	var last string
	for {
		if exited, err := p.exited(); exited {
			return exitError("kube-apiserver", err, s.apiLogs)
		}
		if client == nil {
			if pemBytes, err := os.ReadFile(certFile); err == nil {
				pool := x509.NewCertPool()
				if pool.AppendCertsFromPEM(pemBytes) {
					if !bytes.Equal(s.CACert, pemBytes) { // the same after a restart
						s.CACert = pemBytes
					}
					client = &http.Client{
						Timeout:   5 * time.Second,
						Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
					}
				}
			}
		}
		if client != nil {
			req, _ := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
			req.Header.Set("Authorization", "Bearer "+s.AdminToken)
			resp, err := client.Do(req)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					client.CloseIdleConnections()
					return nil
				}
				last = fmt.Sprintf("%s: %s", resp.Status, body)
			} else {
				last = err.Error()
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %v (last /readyz: %s); its log follows the test's", readyTimeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func exitError(name string, err error, logs *LogBuffer) error {
	out := logs.String()
	if strings.Contains(out, "address already in use") {
		return fmt.Errorf("%s exited (%v): %w", name, err, errPortTaken)
	}
	return fmt.Errorf("%s exited before it was ready (%v); its log follows the test's", name, err)
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen, so that they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// findBinDir returns the directory that holds both binaries, or skips (fails under CI) the test.
// Binary returns the path of a binary that hack/kube-binaries.sh builds (kube-apiserver, etcd,
// kubectl), found as Start finds them. It skips the test when it is missing, or fails it when
// $CI is set.
func Binary(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(findBinDir(t, "", name), name)
}

func findBinDir(t testing.TB, dir string, names ...string) string {
	t.Helper()
	source := "Options.BinDir"
	if dir == "" {
		dir, source = os.Getenv(EnvBinDir), "$"+EnvBinDir
	}
	if dir == "" {
		dir, source = defaultBinDir(), "the default cache directory of hack/kube-binaries.sh"
	}
	var missing []string
	for _, name := range names {
		if dir == "" {
			missing = append(missing, name)
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return dir
	}
	where := "no directory found"
	if dir != "" {
		where = "not in " + dir + " (from " + source + ")"
	}
	msg := fmt.Sprintf("kubetest: %s %s; build them with `make kube-binaries` and set %s=$(hack/kube-binaries.sh)",
		strings.Join(missing, " and "), where, EnvBinDir)
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (CI is set: integration tests must run)")
	}
	t.Skip("skipping: " + msg)
	return ""
}

// defaultBinDir returns where hack/kube-binaries.sh puts the binaries when KUBE_BIN_DIR is unset:
// $HOME/.cache/netwarden/kube-bin/<kubernetes-version>-<etcd-version>, with the versions pinned
// by hack/kubetools/go.mod, found by walking up from the working directory. It returns "" when
// either cannot be found.
func defaultBinDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if gomod, err := os.ReadFile(filepath.Join(d, "hack", "kubetools", "go.mod")); err == nil {
			k8s, etcd := requiredVersion(gomod, "k8s.io/kubernetes"), requiredVersion(gomod, "go.etcd.io/etcd/server/v3")
			if k8s == "" || etcd == "" {
				return ""
			}
			return filepath.Join(home, ".cache", "netwarden", "kube-bin", k8s+"-"+etcd)
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// requiredVersion returns the version of module in a require line of gomod.
func requiredVersion(gomod []byte, module string) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == module && strings.HasPrefix(f[1], "v") {
			return f[1]
		}
	}
	return ""
}

// process is a started child process whose output goes to a LogBuffer.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // of Wait, set before done is closed
}

// OnSpawnThread runs fn, which starts a process, on the one OS thread that starts every test
// process. The kernel sends Pdeathsig when the OS thread that started a process exits, not when
// the test binary does, and the netns test bed retires OS threads on purpose. So every process
// (etcd, kube-apiserver, kube-proxy, agents) is started from one goroutine that stays locked
// to its thread for the life of the binary.
var (
	spawnOnce sync.Once
	spawnReqs chan func()
)

func OnSpawnThread(fn func()) {
	spawnOnce.Do(func() {
		spawnReqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
			for req := range spawnReqs {
				req()
			}
		}()
	})
	done := make(chan struct{})
	spawnReqs <- func() { fn(); close(done) }
	<-done
}

func startProcess(path string, args []string, logs *LogBuffer) (*process, error) {
	cmd := exec.Command(path, args...)
	cmd.Stdout = logs
	cmd.Stderr = logs
	cmd.SysProcAttr = sysProcAttr()
	var err error
	OnSpawnThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, and SIGKILL if the process has not exited after timeout. A zero timeout
// sends SIGKILL only.
func (p *process) stop(timeout time.Duration) {
	if timeout <= 0 {
		_ = p.cmd.Process.Kill()
		<-p.done
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// LogBuffer keeps the last 4 MiB written to it (a process's output), and copies them to stderr
// when $KUBETEST_VERBOSE is set.
type LogBuffer struct {
	name string
	tee  bool
	mu   sync.Mutex
	buf  []byte
}

// NewLogBuffer returns a LogBuffer whose copies to stderr are prefixed with name.
func NewLogBuffer(name string) *LogBuffer {
	return &LogBuffer{name: name, tee: os.Getenv(EnvVerbose) != ""}
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tee {
		for _, line := range strings.SplitAfter(string(p), "\n") {
			if line != "" {
				fmt.Fprintf(os.Stderr, "[%s] %s", b.name, line)
			}
		}
	}
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - logLimit; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
