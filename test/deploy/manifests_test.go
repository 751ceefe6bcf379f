// Package deploy tests the installation manifests in deploy/: their content (manifests_test.go),
// that a real kube-apiserver accepts them, and that the agent enforces policy with no more than
// the rights they grant (cluster_test.go).
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/testkit/kubetest"
)

// manifests is everything in deploy/, decoded strictly (unknown fields are errors).
type manifests struct {
	dir            string
	serviceAccount *corev1.ServiceAccount
	clusterRole    *rbacv1.ClusterRole
	binding        *rbacv1.ClusterRoleBinding
	masqConfig     *corev1.ConfigMap
	daemonSet      *appsv1.DaemonSet
	// crd is the ClusterNetworkPolicy CRD, which client-go's scheme does not decode.
	crd *crdFile
}

// crdFile is a CustomResourceDefinition document of deploy/, read for what the tests check.
type crdFile struct {
	file, name, group string
}

// repoRoot finds the repository root: the nearest directory above the working directory that
// holds go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// deployDir is deploy/ at the repository root.
func deployDir(t testing.TB) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy")
}

// loadManifests decodes every YAML document of every *.yaml and *.yml file in deploy/ (the files
// `kubectl apply -f deploy/` reads) and requires each of the six objects exactly once.
func loadManifests(t testing.TB) *manifests {
	t.Helper()
	m := &manifests{dir: deployDir(t)}
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	seen := map[string]string{} // kind/namespace/name -> file
	files := 0
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		files++
		path := filepath.Join(m.dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for doc := 1; ; doc++ {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", e.Name(), doc, err)
			}
			if len(bytes.TrimSpace(stripComments(raw))) == 0 {
				continue
			}
			if crd, ok := crdDocument(t, raw); ok {
				if m.crd != nil {
					t.Fatalf("%s: document %d: a second CustomResourceDefinition (%s is in %s)", e.Name(), doc, m.crd.name, m.crd.file)
				}
				crd.file = e.Name()
				m.crd = crd
				continue
			}
			obj, gvk, err := decoder.Decode(raw, nil, nil)
			if err != nil {
				t.Fatalf("%s: document %d: %v", e.Name(), doc, err)
			}
			meta, ok := obj.(interface {
				GetName() string
				GetNamespace() string
			})
			if !ok {
				t.Fatalf("%s: document %d: %s has no object metadata", e.Name(), doc, gvk)
			}
			key := gvk.Kind + "/" + meta.GetNamespace() + "/" + meta.GetName()
			if prev, dup := seen[key]; dup {
				t.Fatalf("%s: document %d: %s is also defined in %s", e.Name(), doc, key, prev)
			}
			seen[key] = e.Name()
			if !m.set(obj) {
				t.Fatalf("%s: document %d: unexpected %s %s (deploy/ holds one CustomResourceDefinition, ServiceAccount, ClusterRole, ClusterRoleBinding, ConfigMap and DaemonSet)", e.Name(), doc, gvk, key)
			}
		}
	}
	if files == 0 {
		t.Fatalf("no YAML files in %s", m.dir)
	}
	if m.serviceAccount == nil || m.clusterRole == nil || m.binding == nil || m.masqConfig == nil || m.daemonSet == nil || m.crd == nil {
		t.Fatalf("deploy/ must define the ClusterNetworkPolicy CustomResourceDefinition, a ServiceAccount, a ClusterRole, a ClusterRoleBinding, "+
			"a ConfigMap and a DaemonSet; found %v and CRD %v", sortedKeys(seen), m.crd)
	}
	return m
}

// crdDocument reads raw as a CustomResourceDefinition, if it is one.
func crdDocument(t testing.TB, raw []byte) (*crdFile, bool) {
	t.Helper()
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Group string `json:"group"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil || doc.Kind != "CustomResourceDefinition" {
		return nil, false
	}
	if doc.APIVersion != "apiextensions.k8s.io/v1" {
		t.Fatalf("CustomResourceDefinition %s: apiVersion %s, want apiextensions.k8s.io/v1", doc.Metadata.Name, doc.APIVersion)
	}
	return &crdFile{name: doc.Metadata.Name, group: doc.Spec.Group}, true
}

// set records obj in its slot; it reports false for an unexpected kind or a second object of a kind.
func (m *manifests) set(obj runtime.Object) bool {
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		if m.serviceAccount == nil {
			m.serviceAccount = o
			return true
		}
	case *rbacv1.ClusterRole:
		if m.clusterRole == nil {
			m.clusterRole = o
			return true
		}
	case *rbacv1.ClusterRoleBinding:
		if m.binding == nil {
			m.binding = o
			return true
		}
	case *corev1.ConfigMap:
		if m.masqConfig == nil {
			m.masqConfig = o
			return true
		}
	case *appsv1.DaemonSet:
		if m.daemonSet == nil {
			m.daemonSet = o
			return true
		}
	}
	return false
}

// stripComments drops full-line comments, so a document of only comments counts as empty.
func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// agentContainer is the DaemonSet's container that runs `netwarden agent`.
func (m *manifests) agentContainer(t testing.TB) *corev1.Container {
	t.Helper()
	for i, c := range m.daemonSet.Spec.Template.Spec.Containers {
		if len(c.Args) > 0 && c.Args[0] == "agent" {
			return &m.daemonSet.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatal("the DaemonSet has no container with args `agent ...`")
	return nil
}

// healthAddr returns the --health-addr value of the agent container's args.
func healthAddr(t testing.TB, c *corev1.Container) string {
	t.Helper()
	for i, a := range c.Args {
		if a == "--health-addr" && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--health-addr="); ok {
			return v
		}
	}
	t.Fatalf("agent args %q have no --health-addr", c.Args)
	return ""
}

// wantRules is all the ClusterRole may grant: read access to the five kinds the agent watches,
// and the patch of the ClusterNetworkPolicy status that carries the agents' condition.
var wantRules = map[string][]string{ // API group -> resources
	"":                         {"namespaces", "nodes", "pods"},
	"networking.k8s.io":        {"networkpolicies"},
	"policy.networking.k8s.io": {"clusternetworkpolicies", "clusternetworkpolicies/status"},
}

var readVerbs = []string{"get", "list", "watch"}

// wantVerbs returns the verbs the ClusterRole must grant, exactly, on resource.
func wantVerbs(resource string) []string {
	if strings.HasSuffix(resource, "/status") {
		return []string{"patch"}
	}
	return readVerbs
}

func TestManifests(t *testing.T) {
	m := loadManifests(t)
	ds := m.daemonSet
	pod := ds.Spec.Template.Spec

	t.Run("rbac", func(t *testing.T) {
		granted := map[string][]string{}
		for i, r := range m.clusterRole.Rules {
			if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
				t.Errorf("rule %d: nonResourceURLs or resourceNames are not needed: %+v", i, r)
			}
			for _, res := range r.Resources {
				if got, want := slices.Sorted(slices.Values(r.Verbs)), wantVerbs(res); !slices.Equal(got, want) {
					t.Errorf("rule %d: verbs %v on %s, want exactly %v (informers list and watch, get for single reads; "+
						"the status is only patched)", i, r.Verbs, res, want)
				}
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					if !slices.Contains(wantRules[g], res) {
						t.Errorf("rule %d grants %q in API group %q; the agent reads only %v", i, res, g, wantRules)
					}
					granted[g] = append(granted[g], res)
				}
			}
		}
		for g, resources := range wantRules {
			for _, res := range resources {
				if !slices.Contains(granted[g], res) {
					t.Errorf("the ClusterRole does not grant %q in API group %q, which the agent watches", res, g)
				}
			}
		}
		if m.clusterRole.AggregationRule != nil {
			t.Error("the ClusterRole must not aggregate other roles")
		}
		ref := m.binding.RoleRef
		if ref.APIGroup != rbacv1.GroupName || ref.Kind != "ClusterRole" || ref.Name != m.clusterRole.Name {
			t.Errorf("the binding refers to %+v, want ClusterRole %s", ref, m.clusterRole.Name)
		}
		want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: m.serviceAccount.Name, Namespace: m.serviceAccount.Namespace}
		if len(m.binding.Subjects) != 1 || m.binding.Subjects[0] != want {
			t.Errorf("the binding's subjects are %+v, want only %+v", m.binding.Subjects, want)
		}
		if m.serviceAccount.Namespace != "kube-system" || m.serviceAccount.Name != "netwarden" {
			t.Errorf("service account %s/%s, want kube-system/netwarden", m.serviceAccount.Namespace, m.serviceAccount.Name)
		}
		if pod.ServiceAccountName != m.serviceAccount.Name || ds.Namespace != m.serviceAccount.Namespace {
			t.Errorf("the DaemonSet %s/%s runs as service account %q, want %s/%s", ds.Namespace, ds.Name,
				pod.ServiceAccountName, m.serviceAccount.Namespace, m.serviceAccount.Name)
		}
	})

	t.Run("crd", func(t *testing.T) {
		if m.crd.name != "clusternetworkpolicies.policy.networking.k8s.io" || m.crd.group != "policy.networking.k8s.io" {
			t.Errorf("CustomResourceDefinition %s of group %s, want the ClusterNetworkPolicy CRD", m.crd.name, m.crd.group)
		}
		// The released file of the version in go.mod, under a comment: the agent's API types
		// and the CRD must agree.
		shipped, err := os.ReadFile(filepath.Join(m.dir, m.crd.file))
		if err != nil {
			t.Fatal(err)
		}
		released, err := os.ReadFile(kubetest.ClusterNetworkPolicyCRD(t, kubetest.CRDStandard))
		if err != nil {
			t.Fatal(err)
		}
		for bytes.HasPrefix(shipped, []byte("#")) {
			_, shipped, _ = bytes.Cut(shipped, []byte("\n"))
		}
		if !bytes.Equal(shipped, released) {
			t.Errorf("deploy/%s is not, below its leading comment, the standard CRD of %s in go.mod", m.crd.file, kubetest.NetworkPolicyAPIModule)
		}
	})

	t.Run("daemonset", func(t *testing.T) {
		if ds.Namespace != "kube-system" || ds.Name != "netwarden" {
			t.Errorf("DaemonSet %s/%s, want kube-system/netwarden", ds.Namespace, ds.Name)
		}
		if !pod.HostNetwork {
			t.Error("hostNetwork must be true: the agent programs the node's network namespace")
		}
		if pod.HostPID || pod.HostIPC {
			t.Error("hostPID and hostIPC are not needed")
		}
		if pod.PriorityClassName != "system-node-critical" {
			t.Errorf("priorityClassName %q, want system-node-critical", pod.PriorityClassName)
		}
		if !toleratesEverything(pod.Tolerations) {
			t.Errorf("tolerations %+v do not tolerate every taint (want one with operator Exists and no key or effect)", pod.Tolerations)
		}
		if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType {
			t.Errorf("updateStrategy %q, want RollingUpdate", u.Type)
		} else if u.RollingUpdate != nil && u.RollingUpdate.MaxSurge != nil && u.RollingUpdate.MaxSurge.IntValue() != 0 {
			t.Errorf("maxSurge %s: two agents on one node would share the health port and the nftables table", u.RollingUpdate.MaxSurge)
		}
		for k, v := range ds.Spec.Selector.MatchLabels {
			if got := ds.Spec.Template.Labels[k]; got != v {
				t.Errorf("selector %s=%s does not match the template's labels", k, v)
			}
		}

		all := append(slices.Clone(pod.InitContainers), pod.Containers...)
		for _, c := range all {
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("container %s has no securityContext", c.Name)
				continue
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("container %s is privileged", c.Name)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("container %s must set allowPrivilegeEscalation: false", c.Name)
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("container %s must drop ALL capabilities", c.Name)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("container %s has no cpu and memory requests", c.Name)
			}
		}
		for _, c := range pod.InitContainers {
			if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
				t.Errorf("init container %s adds capabilities %v; copying files needs none", c.Name, sc.Capabilities.Add)
			}
		}

		agent := m.agentContainer(t)
		if sc := agent.SecurityContext; sc != nil && sc.Capabilities != nil {
			got := slices.Sorted(slices.Values(sc.Capabilities.Add))
			if want := []corev1.Capability{"NET_ADMIN", "NET_RAW"}; !slices.Equal(got, want) {
				t.Errorf("agent capabilities %v, want exactly %v", got, want)
			}
		}
		if sc := agent.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
			// Capabilities added by Kubernetes are only effective for uid 0 (no ambient set).
			t.Error("the agent must run as uid 0 for its added capabilities to be effective")
		}

		// NODE_NAME from the downward API: the agent's --node-name default.
		var nodeName *corev1.EnvVar
		for i := range agent.Env {
			if agent.Env[i].Name == "NODE_NAME" {
				nodeName = &agent.Env[i]
			}
		}
		if nodeName == nil || nodeName.ValueFrom == nil || nodeName.ValueFrom.FieldRef == nil || nodeName.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
			t.Errorf("agent env NODE_NAME must come from fieldRef spec.nodeName; env is %+v", agent.Env)
		}

		// Probes on the port --health-addr listens on.
		_, port, err := net.SplitHostPort(healthAddr(t, agent))
		if err != nil {
			t.Fatalf("--health-addr: %v", err)
		}
		for _, p := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{{"liveness", agent.LivenessProbe, "/healthz"}, {"readiness", agent.ReadinessProbe, "/readyz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("agent has no HTTP %s probe", p.name)
				continue
			}
			if p.probe.HTTPGet.Path != p.path {
				t.Errorf("%s probe path %q, want %s", p.name, p.probe.HTTPGet.Path, p.path)
			}
			if got := probePort(agent, p.probe.HTTPGet.Port.String()); got != port {
				t.Errorf("%s probe port %s, but --health-addr listens on %s", p.name, got, port)
			}
		}

		// Host paths.
		mounts := map[string]string{} // mount path -> host path, over all containers
		for _, c := range all {
			for _, vm := range c.VolumeMounts {
				for _, v := range pod.Volumes {
					if v.Name == vm.Name && v.HostPath != nil {
						mounts[vm.MountPath] = v.HostPath.Path
						if v.HostPath.Path == "/run/xtables.lock" && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathFileOrCreate) {
							t.Error("the xtables lock must be a hostPath of type FileOrCreate")
						}
					}
				}
			}
		}
		if mounts["/run/xtables.lock"] != "/run/xtables.lock" {
			t.Errorf("/run/xtables.lock is not mounted from the host; host paths mounted: %v", mounts)
		}
		cniInstalled := false
		for _, hostPath := range mounts {
			cniInstalled = cniInstalled || hostPath == "/opt/cni/bin"
		}
		if !cniInstalled || len(pod.InitContainers) == 0 {
			t.Error("an init container must install the CNI plugins into the host's /opt/cni/bin")
		}
		for _, v := range pod.Volumes {
			if v.HostPath != nil && !slices.Contains([]string{"/run/xtables.lock", "/opt/cni/bin"}, v.HostPath.Path) {
				t.Errorf("unexpected hostPath volume %s: %s", v.Name, v.HostPath.Path)
			}
		}
	})

	t.Run("masq-config", func(t *testing.T) {
		cm := m.masqConfig
		if cm.Name != "netwarden-masq" || cm.Namespace != ds.Namespace {
			t.Errorf("ConfigMap %s/%s, want %s/netwarden-masq", cm.Namespace, cm.Name, ds.Namespace)
		}
		// The ip-masq-agent configuration format.
		var cfg struct {
			NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs"`
			CIDRLimit          int      `json:"cidrLimit,omitempty"`
			MasqLinkLocal      bool     `json:"masqLinkLocal"`
			MasqLinkLocalIPv6  bool     `json:"masqLinkLocalIPv6"`
			ResyncInterval     string   `json:"resyncInterval"`
		}
		data, ok := cm.Data["config"]
		if !ok {
			t.Fatalf("ConfigMap %s has no key config", cm.Name)
		}
		if err := yaml.UnmarshalStrict([]byte(data), &cfg); err != nil {
			t.Fatalf("config: %v", err)
		}
		if len(cfg.NonMasqueradeCIDRs) == 0 {
			t.Error("config: nonMasqueradeCIDRs is empty")
		}
		for _, c := range cfg.NonMasqueradeCIDRs {
			if p, err := netip.ParsePrefix(c); err != nil || p != p.Masked() {
				t.Errorf("config: nonMasqueradeCIDRs: %q is not a CIDR (%v)", c, err)
			}
		}
	})

	t.Run("agent-flags", func(t *testing.T) {
		// The binary accepts the DaemonSet's arguments (checked by parsing its help).
		bin := os.Getenv("NETWARDEN_BIN")
		if bin == "" {
			skipOrFail(t, "NETWARDEN_BIN is not set (make test sets it)")
		}
		agent := m.agentContainer(t)
		out, err := exec.Command(bin, append(slices.Clone(agent.Args), "--help")...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s --help: %v\n%s", bin, strings.Join(agent.Args, " "), err, out)
		}
		for _, flag := range []string{"--health-addr", "--node-name"} {
			if !strings.Contains(string(out), flag) {
				t.Errorf("`netwarden agent --help` does not mention %s", flag)
			}
		}
	})
}

func toleratesEverything(ts []corev1.Toleration) bool {
	for _, t := range ts {
		if t.Operator == corev1.TolerationOpExists && t.Key == "" && t.Effect == "" {
			return true
		}
	}
	return false
}

// probePort resolves a probe's port (a number or a container port name) to a number.
func probePort(c *corev1.Container, port string) string {
	for _, p := range c.Ports {
		if p.Name == port {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return port
}

// initScript returns the init container's shell script (the last element of its command).
func (m *manifests) initScript(t testing.TB) string {
	t.Helper()
	for _, c := range m.daemonSet.Spec.Template.Spec.InitContainers {
		if len(c.Command) >= 2 && strings.HasSuffix(c.Command[0], "sh") {
			return c.Command[len(c.Command)-1]
		}
	}
	t.Fatal("no init container runs a shell script")
	return ""
}

// TestInstallCNIPlugins runs the init container's script with /bin/sh against temporary
// directories: it installs whatever plugins the image holds, replaces older copies, and succeeds
// when the image holds none (netwarden-portmap and netwarden-ipmasq do not exist yet).
func TestInstallCNIPlugins(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		skipOrFail(t, "needs /bin/sh")
	}
	script := loadManifests(t).initScript(t)
	for _, p := range []string{"/opt/netwarden/cni", "/host/opt/cni/bin"} {
		if !strings.Contains(script, p) {
			t.Fatalf("the init script does not mention %s:\n%s", p, script)
		}
	}
	run := func(src, dst string) string {
		t.Helper()
		s := strings.ReplaceAll(script, "/opt/netwarden/cni", src)
		s = strings.ReplaceAll(s, "/host/opt/cni/bin", dst)
		out, err := exec.Command("sh", "-ec", s).CombinedOutput()
		if err != nil {
			t.Fatalf("init script: %v\n%s", err, out)
		}
		return string(out)
	}

	dst := t.TempDir()
	if err := os.WriteFile(filepath.Join(dst, "bridge"), []byte("other plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// No plugins in the image: the source directory is missing, or empty.
	run(filepath.Join(t.TempDir(), "missing"), dst)
	run(t.TempDir(), dst)
	if names := dirNames(t, dst); !slices.Equal(names, []string{"bridge"}) {
		t.Fatalf("with no plugins to install, %s holds %v", dst, names)
	}

	src := t.TempDir()
	for _, name := range []string{"netwarden-portmap", "netwarden-ipmasq"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte("#!/bin/sh\necho "+name+" v1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := run(src, dst)
	if err := os.WriteFile(filepath.Join(src, "netwarden-portmap"), []byte("#!/bin/sh\necho v2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out += run(src, dst)
	if names := dirNames(t, dst); !slices.Equal(names, []string{"bridge", "netwarden-ipmasq", "netwarden-portmap"}) {
		t.Fatalf("%s holds %v after the install\n%s", dst, names, out)
	}
	for name, want := range map[string]string{"netwarden-portmap": "v2", "netwarden-ipmasq": "netwarden-ipmasq v1", "bridge": ""} {
		fi, err := os.Stat(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s has mode %v, want 0755", name, fi.Mode().Perm())
		}
		if want == "" {
			continue
		}
		got, err := exec.Command(filepath.Join(dst, name)).Output()
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("running the installed %s: %q, %v; want %q", name, got, err, want)
		}
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// skipOrFail skips the test with the reason, or fails it when $CI is set (CI must run everything).
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("cannot run in CI: %s", why)
	}
	t.Skipf("skipping: %s", why)
}
