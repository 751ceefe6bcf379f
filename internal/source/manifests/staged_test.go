package manifests

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/netwarden/netwarden/internal/cluster"
)

// TestStagedAnnotationKept: objects are stripped to what the agent reads, and the staged
// annotation is part of that, for NetworkPolicies and ClusterNetworkPolicies; other
// annotations go.
func TestStagedAnnotationKept(t *testing.T) {
	dir := t.TempDir()
	data := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x, annotations: {netwarden.io/staged: "true", other: "y"}}
spec: {podSelector: {}}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: c, annotations: {netwarden.io/staged: "true", other: "y"}}
spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}
`
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	st, errs := Load(dir, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for name, a := range map[string]map[string]string{"NetworkPolicy": st.Policies["x/p"].Annotations, "ClusterNetworkPolicy": st.ClusterPolicies["c"].Annotations} {
		if len(a) != 1 || a[cluster.StagedAnnotation] != "true" {
			t.Errorf("%s annotations after loading: %v, want only the staged one", name, a)
		}
	}
}
