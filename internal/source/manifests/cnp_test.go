package manifests

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// cnpDoc returns a valid ClusterNetworkPolicy manifest of apiVersion version.
func cnpDoc(version, name string, priority int) string {
	return `apiVersion: policy.networking.k8s.io/` + version + `
kind: ClusterNetworkPolicy
metadata:
  name: ` + name + `
  annotations:
    note: dropped
  labels:
    owner: sec
spec:
  tier: Admin
  priority: ` + strconv.Itoa(priority) + `
  subject:
    namespaces:
      matchLabels:
        team: a
  egress:
  - name: no-metadata
    action: Deny
    to:
    - networks: ["169.254.169.254/32", "fd00::/8"]
  - action: Accept
    to:
    - pods:
        namespaceSelector: {}
        podSelector:
          matchLabels:
            app: dns
    protocols:
    - udp:
        destinationPort:
          number: 53
    - tcp:
        destinationPort:
          range: {start: 8000, end: 8080}
  ingress:
  - action: Pass
    from:
    - namespaces: {}
status:
  conditions:
  - type: Ready
    status: "True"
    reason: Seen
    message: dropped
    lastTransitionTime: "2026-01-01T00:00:00Z"
`
}

func TestLoadClusterNetworkPolicy(t *testing.T) {
	dir := t.TempDir()
	badCIDR := strings.Replace(cnpDoc("v1beta1", "bad", 20), "fd00::/8", "10.0.0.0/33", 1)
	writeFiles(t, dir, map[string]string{
		"beta.yaml":  cnpDoc("v1beta1", "beta", 10),
		"alpha.yaml": cnpDoc("v1alpha2", "alpha", 5),
		// A typed list of v1alpha2 whose item carries no apiVersion and kind: the list's version.
		"list.json": `{"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicyList", "items": [
			{"metadata": {"name": "listed"}, "spec": {"tier": "Baseline", "priority": 1000,
			 "subject": {"pods": {"namespaceSelector": {}, "podSelector": {}}},
			 "ingress": [{"action": "Deny", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {}}}]}]}}]}`,
		"bad.yaml":    badCIDR,
		"v1a1.yaml":   cnpDoc("v1alpha1", "old", 1),
		"policy.yaml": policy("foo", "p"),
	})
	st, errs := Load(dir, nil)
	checkErrors(t, dir, errs, []string{
		`DIR/bad.yaml: document 1 (ClusterNetworkPolicy bad): spec.egress[0].to[0].networks[1]: Invalid value: "10.0.0.0/33": invalid CIDR`,
		`DIR/v1a1.yaml: document 1 (ClusterNetworkPolicy old): apiVersion: Unsupported value: "policy.networking.k8s.io/v1alpha1": supported values: "policy.networking.k8s.io/v1beta1", "policy.networking.k8s.io/v1alpha2"`,
	})
	want := []string{"ClusterNetworkPolicy alpha", "ClusterNetworkPolicy beta", "ClusterNetworkPolicy listed", "NetworkPolicy foo/p"}
	if got := keys(st); !slices.Equal(got, want) {
		t.Fatalf("objects: got %q, want %q", got, want)
	}

	beta, alpha := st.ClusterPolicies["beta"], st.ClusterPolicies["alpha"]
	wantType := metav1.TypeMeta{Kind: "ClusterNetworkPolicy", APIVersion: "policy.networking.k8s.io/v1beta1"}
	for _, c := range []*npav1beta1.ClusterNetworkPolicy{beta, alpha, st.ClusterPolicies["listed"]} {
		if c.TypeMeta != wantType {
			t.Errorf("%s: TypeMeta %+v, want %+v (v1alpha2 is read as v1beta1)", c.Name, c.TypeMeta, wantType)
		}
		if c.Annotations != nil || c.ManagedFields != nil || c.Status.Conditions != nil {
			t.Errorf("%s: annotations, managed fields or status kept: %+v %+v", c.Name, c.ObjectMeta, c.Status)
		}
	}
	if beta.Labels["owner"] != "sec" {
		t.Errorf("labels dropped: %v", beta.Labels)
	}
	// The same document in either version gives the same object.
	if a, b := alpha.Spec, beta.Spec; b.Priority != 10 || a.Priority != 5 {
		t.Errorf("priorities %d %d", b.Priority, a.Priority)
	} else {
		a.Priority = b.Priority
		if !reflect.DeepEqual(a, b) {
			t.Errorf("v1alpha2 and v1beta1 documents differ:\n%+v\n%+v", a, b)
		}
	}
	e := beta.Spec.Egress
	if len(e) != 2 || e[0].Action != npav1beta1.ClusterNetworkPolicyRuleActionDeny || !slices.Equal(e[0].To[0].Networks, []npav1beta1.CIDR{"169.254.169.254/32", "fd00::/8"}) ||
		e[1].Protocols[1].TCP.DestinationPort.Range.End != 8080 || e[1].Protocols[0].UDP.DestinationPort.Number != 53 {
		t.Errorf("egress decoded as %+v", e)
	}
	if l := st.ClusterPolicies["listed"]; l.Spec.Tier != npav1beta1.BaselineTier || l.Spec.Subject.Pods == nil {
		t.Errorf("listed: %+v", l.Spec)
	}
}

// TestLoadClusterNetworkPolicyPeers: a peer with no field (one this version does not know) and a
// domainNames peer are kept for the compiler; unknown fields are still errors of strict decoding,
// and so is a domainNames peer in a rule that is not Accept.
func TestLoadClusterNetworkPolicyPeers(t *testing.T) {
	dir := t.TempDir()
	docAction := func(name, action, to string) string {
		return "apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata:\n  name: " + name +
			"\nspec:\n  tier: Baseline\n  priority: 0\n  subject:\n    namespaces: {}\n  egress:\n  - action: " + action + "\n    to:\n    - " + to + "\n"
	}
	doc := func(name, to string) string { return docAction(name, "Deny", to) }
	writeFiles(t, dir, map[string]string{
		"empty.yaml":   doc("empty", "{}"),
		"domains.yaml": docAction("domains", "Accept", `domainNames: ["*.example.com", "example.org"]`),
		"denied.yaml":  doc("denied", `domainNames: ["example.org"]`),
		"nodes.yaml":   doc("nodes", `nodes: {matchLabels: {role: infra}}`),
		"unknown.yaml": doc("unknown", `services: {}`),
		"two.yaml":     doc("two", `{namespaces: {}, networks: ["10.0.0.0/8"]}`),
	})
	st, errs := Load(dir, nil)
	checkErrors(t, dir, errs, []string{
		`DIR/denied.yaml: document 1 (ClusterNetworkPolicy denied): spec.egress[0].to[0].domainNames: Invalid value: "Deny": domainNames peers are allowed only in Accept rules (rule action is Deny); deny the rest in a rule after it`,
		`DIR/two.yaml: document 1 (ClusterNetworkPolicy two): spec.egress[0].to[0]: Invalid value: "namespaces, networks": at most one of namespaces, pods, nodes, networks, domainNames may be set`,
		`DIR/unknown.yaml: document 1 (ClusterNetworkPolicy unknown): unknown field "spec.egress[0].to[0].services"`,
	})
	want := []string{"ClusterNetworkPolicy domains", "ClusterNetworkPolicy empty", "ClusterNetworkPolicy nodes"}
	if got := keys(st); !slices.Equal(got, want) {
		t.Fatalf("objects: got %q, want %q", got, want)
	}
	if p := st.ClusterPolicies["empty"].Spec.Egress[0].To[0]; !reflect.DeepEqual(p, npav1beta1.ClusterNetworkPolicyEgressPeer{}) {
		t.Errorf("empty peer: %+v", p)
	}
	if d := st.ClusterPolicies["domains"].Spec.Egress[0].To[0].DomainNames; len(d) != 2 {
		t.Errorf("domainNames: %v", d)
	}
}

func TestReloadClusterNetworkPolicy(t *testing.T) {
	invalid := strings.Replace(cnpDoc("v1beta1", "c", 7), "priority: 7", "priority: 1001", 1)
	runSteps(t, []step{
		{
			name:   "read",
			write:  map[string]string{"c.yaml": cnpDoc("v1beta1", "c", 1), "p.yaml": policy("foo", "p")},
			want:   []string{"ClusterNetworkPolicy c", "NetworkPolicy foo/p"},
			notify: true,
		},
		{
			name:   "priority updated",
			write:  map[string]string{"c.yaml": cnpDoc("v1beta1", "c", 2)},
			want:   []string{"ClusterNetworkPolicy c", "NetworkPolicy foo/p"},
			notify: true,
		},
		{
			name:        "a change of dropped fields only, and a move to v1alpha2, changes no object",
			write:       map[string]string{"c.yaml": strings.Replace(cnpDoc("v1alpha2", "c", 2), "note: dropped", "note: other", 1)},
			want:        []string{"ClusterNetworkPolicy c", "NetworkPolicy foo/p"},
			notify:      true,
			sameObjects: true,
		},
		{
			name:        "an invalid version keeps the last good one, and the others",
			write:       map[string]string{"c.yaml": invalid},
			want:        []string{"ClusterNetworkPolicy c", "NetworkPolicy foo/p"},
			wantErrs:    []string{"DIR/c.yaml: document 1 (ClusterNetworkPolicy c): spec.priority: Invalid value: 1001: must be between 0 and 1000"},
			notify:      true,
			sameObjects: true,
		},
		{
			name:   "file removed",
			remove: []string{"c.yaml"},
			want:   []string{"NetworkPolicy foo/p"},
			notify: true,
		},
	})
}

// TestClusterNetworkPolicyChanges: a change of one ClusterNetworkPolicy lists only its key, and
// the other objects keep their pointers.
func TestClusterNetworkPolicyChanges(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": cnpDoc("v1beta1", "a", 1), "b.yaml": cnpDoc("v1beta1", "b", 1), "p.yaml": policy("foo", "p")})
	s := New(dir, nil)
	if err := s.reload(nil); err != nil {
		t.Fatal(err)
	}
	before := s.Snapshot()
	writeFiles(t, dir, map[string]string{"b.yaml": cnpDoc("v1beta1", "b", 9)})
	if err := s.update([]string{"b.yaml"}, false, nil); err != nil {
		t.Fatal(err)
	}
	after := s.Snapshot()
	ch := after.Changes
	if ch == nil || ch.Since != before.Generation || !slices.Equal(ch.ClusterPolicies, []string{"b"}) ||
		len(ch.Policies)+len(ch.Pods)+len(ch.Namespaces)+len(ch.Nodes) != 0 {
		t.Fatalf("changes: %+v", ch)
	}
	if after.ClusterPolicies["a"] != before.ClusterPolicies["a"] || after.ClusterPolicies["b"].Spec.Priority != 9 ||
		before.ClusterPolicies["b"].Spec.Priority != 1 {
		t.Error("snapshot objects: a replaced, or b not updated, or the earlier snapshot changed")
	}
}

func TestRunWatchesClusterNetworkPolicy(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"p.yaml": policy("foo", "p")})
	s := New(dir, nil)
	notified, _ := run(t, s)
	waitFor(t, s, notified, []string{"NetworkPolicy foo/p"})

	writeFiles(t, dir, map[string]string{"c.yaml": cnpDoc("v1alpha2", "c", 3)})
	waitFor(t, s, notified, []string{"ClusterNetworkPolicy c", "NetworkPolicy foo/p"})
	if got := s.Snapshot().ClusterPolicies["c"].Spec.Priority; got != 3 {
		t.Errorf("priority %d", got)
	}
	writeFiles(t, dir, map[string]string{"c.yaml": cnpDoc("v1beta1", "c", 4)})
	waitUntil(t, func() bool { c := s.Snapshot().ClusterPolicies["c"]; return c != nil && c.Spec.Priority == 4 })
	if err := os.Remove(filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, notified, []string{"NetworkPolicy foo/p"})
}

// TestV1alpha2SchemaIsV1beta1 holds the assumption that lets the manifests read v1alpha2 as
// v1beta1: both versions have the same fields, with the same JSON names and types. A later
// release that makes them differ fails here rather than misreading policies.
func TestV1alpha2SchemaIsV1beta1(t *testing.T) {
	var walk func(a, b reflect.Type, path string)
	seen := map[reflect.Type]bool{}
	walk = func(a, b reflect.Type, path string) {
		if a.Kind() != b.Kind() {
			t.Errorf("%s: %s in v1alpha2, %s in v1beta1", path, a.Kind(), b.Kind())
			return
		}
		switch a.Kind() {
		case reflect.Pointer, reflect.Slice:
			walk(a.Elem(), b.Elem(), path+"[]")
		case reflect.Map:
			walk(a.Key(), b.Key(), path+"{key}")
			walk(a.Elem(), b.Elem(), path+"{}")
		case reflect.Struct:
			if a == b || seen[a] { // shared types (metav1) are the same by definition
				return
			}
			seen[a] = true
			if a.NumField() != b.NumField() {
				t.Errorf("%s: %d fields in v1alpha2, %d in v1beta1", path, a.NumField(), b.NumField())
				return
			}
			for i := range a.NumField() {
				fa, fb := a.Field(i), b.Field(i)
				if fa.Name != fb.Name || fa.Tag.Get("json") != fb.Tag.Get("json") {
					t.Errorf("%s: field %s `%s` in v1alpha2, %s `%s` in v1beta1", path, fa.Name, fa.Tag, fb.Name, fb.Tag)
					continue
				}
				walk(fa.Type, fb.Type, path+"."+fa.Name)
			}
		}
	}
	walk(reflect.TypeFor[npav1alpha2.ClusterNetworkPolicy](), reflect.TypeFor[npav1beta1.ClusterNetworkPolicy](), "ClusterNetworkPolicy")
}
