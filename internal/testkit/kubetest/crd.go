package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// CRDChannel is a release channel of the network-policy-api CRDs.
type CRDChannel string

const (
	// CRDStandard is the standard channel, which deploy/ ships. Its schema prunes the
	// experimental fields (destinationNamedPort, nodes and domainNames peers).
	CRDStandard CRDChannel = "standard"
	// CRDExperimental is the experimental channel: the standard fields and the experimental ones.
	CRDExperimental CRDChannel = "experimental"
)

// NetworkPolicyAPIModule is the Go module whose CRDs ClusterNetworkPolicyCRD finds.
const NetworkPolicyAPIModule = "sigs.k8s.io/network-policy-api"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ClusterNetworkPolicyCRDName is the name of the ClusterNetworkPolicy CRD.
const ClusterNetworkPolicyCRDName = "clusternetworkpolicies.policy.networking.k8s.io"

// ClusterNetworkPolicyCRD returns the path of the ClusterNetworkPolicy CRD of channel in the
// module source of sigs.k8s.io/network-policy-api, at the version the repository's go.mod
// requires, in the Go module cache.
func ClusterNetworkPolicyCRD(t TB, channel CRDChannel) string {
	t.Helper()
	dir, err := moduleDir(NetworkPolicyAPIModule)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	path := filepath.Join(dir, "config", "crd", string(channel), "policy.networking.k8s.io_clusternetworkpolicies.yaml")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("kubetest: the %s ClusterNetworkPolicy CRD: %v (run `go mod download %s`)", channel, err, NetworkPolicyAPIModule)
	}
	return path
}

// moduleDir returns the directory of module in the module cache, at the version required by the
// go.mod found above the working directory.
func moduleDir(module string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	var version string
	for d := wd; ; d = filepath.Dir(d) {
		if gomod, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil {
			if version = requiredVersion(gomod, module); version == "" {
				return "", fmt.Errorf("%s does not require %s", filepath.Join(d, "go.mod"), module)
			}
			break
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
			cache = strings.TrimSpace(string(out))
		}
	}
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the Go module cache: %w", err)
		}
		cache = filepath.Join(home, "go", "pkg", "mod")
	}
	return filepath.Join(cache, escapeModulePath(module)+"@"+version), nil
}

// escapeModulePath spells a module path as the module cache does: each upper-case letter as "!"
// and its lower case.
func escapeModulePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// InstallClusterNetworkPolicyCRD installs the ClusterNetworkPolicy CRD of channel (see
// InstallCRD).
func (s *Server) InstallClusterNetworkPolicyCRD(t TB, channel CRDChannel) {
	t.Helper()
	s.InstallCRD(t, ClusterNetworkPolicyCRD(t, channel))
}

// InstallCRD creates the CustomResourceDefinition in the YAML file at path, or replaces the one
// of that name, and waits until it is Established and API discovery lists its resource in every
// served version, so that clients can use it at once. It returns the CRD's name. A replaced
// schema is not waited for (the API server shows no sign of having taken it): to use another
// channel, delete the CRD first (DeleteCRD).
func (s *Server) InstallCRD(t TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &obj.Object); err != nil {
		t.Fatalf("kubetest: %s: %v", path, err)
	}
	if obj.GetKind() != "CustomResourceDefinition" {
		t.Fatalf("kubetest: %s holds a %s, not a CustomResourceDefinition", path, obj.GetKind())
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	crds := s.dynamic(t).Resource(crdResource)
	name := obj.GetName()
	if _, err := crds.Create(ctx, obj, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("kubetest: CRD %s: %v", name, err)
		}
		obj.SetResourceVersion(cur.GetResourceVersion())
		if _, err := crds.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("kubetest: replacing CRD %s: %v", name, err)
		}
	} else if err != nil {
		t.Fatalf("kubetest: creating CRD %s: %v", name, err)
	}

	group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(obj.Object, "spec", "versions")
	disco := s.discovery(t)
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cur, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if !crdCondition(cur, "Established") || !crdCondition(cur, "NamesAccepted") {
			return false, nil
		}
		for _, v := range versions {
			v, _ := v.(map[string]any)
			if served, _ := v["served"].(bool); !served {
				continue
			}
			version, _ := v["name"].(string)
			if !discoveryLists(disco, group+"/"+version, plural) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("kubetest: CRD %s not established and served within %v: %v", name, readyTimeout, err)
	}
	return name
}

// DeleteCRD deletes the CustomResourceDefinition name and waits until it is gone (the API server
// deletes its objects first) and API discovery no longer lists its resource.
func (s *Server) DeleteCRD(t TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	crds := s.dynamic(t).Resource(crdResource)
	cur, err := crds.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kubetest: CRD %s: %v", name, err)
	}
	group, _, _ := unstructured.NestedString(cur.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(cur.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(cur.Object, "spec", "versions")
	if err := crds.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("kubetest: deleting CRD %s: %v", name, err)
	}
	disco := s.discovery(t)
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if _, err := crds.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		for _, v := range versions {
			v, _ := v.(map[string]any)
			version, _ := v["name"].(string)
			if discoveryLists(disco, group+"/"+version, plural) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("kubetest: CRD %s still there after %v: %v", name, readyTimeout, err)
	}
}

func crdCondition(crd *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		c, _ := c.(map[string]any)
		if c["type"] == typ {
			return c["status"] == "True"
		}
	}
	return false
}

func discoveryLists(disco discovery.DiscoveryInterface, groupVersion, resource string) bool {
	list, err := disco.ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}

func (s *Server) dynamic(t TB) dynamic.Interface {
	t.Helper()
	return adminClient(t, s, "dynamic", dynamic.NewForConfig)
}

func (s *Server) discovery(t TB) discovery.DiscoveryInterface {
	t.Helper()
	return adminClient(t, s, "discovery", discovery.NewDiscoveryClientForConfig)
}
