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
	"path/filepath"
	"strconv"
	"strings"
	"time"
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
func Start(t TB, opts Options) *Server {
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

func start(t TB, binDir string, opts Options) (_ *Server, err error) {
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
func (s *Server) StartAPIServer(t TB) {
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
func (s *Server) Restart(t TB) {
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

// PIDs returns the process IDs of kube-apiserver and etcd, for measuring what they use.
func (s *Server) PIDs() (apiserver, etcd int) {
	return s.apiserver.cmd.Process.Pid, s.etcd.cmd.Process.Pid
}
