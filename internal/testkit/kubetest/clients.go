package kubetest

import (
	"bytes"
	"context"
	"path/filepath"
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
func (s *Server) AdminClient(t TB) kubernetes.Interface {
	t.Helper()
	return adminClient(t, s, "admin", kubernetes.NewForConfig)
}

// adminClient makes a client of kind with the admin token, or fails the test.
func adminClient[C any](t TB, s *Server, kind string, newForConfig func(*rest.Config) (C, error)) C {
	t.Helper()
	c, err := newForConfig(s.AdminConfig())
	if err != nil {
		t.Fatalf("kubetest: %s client: %v", kind, err)
	}
	return c
}

// Kubeconfig writes a kubeconfig file that authenticates with token (the admin token when empty)
// into a temporary directory of t and returns its path.
func (s *Server) Kubeconfig(t TB, token string) string {
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
func (s *Server) CreateServiceAccountToken(t TB, namespace, name string) string {
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
