package manifests

import (
	"bytes"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

const (
	nsFoo = `apiVersion: v1
kind: Namespace
metadata:
  name: foo
  labels:
    team: a
`
	podWeb = `apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: foo
  labels:
    app: web
spec:
  nodeName: node-1
  containers:
  - name: nginx
    image: nginx
    ports:
    - name: http
      containerPort: 80
status:
  phase: Running
  podIP: 10.244.1.5
`
	policyAllowWeb = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-web
spec:
  podSelector:
    matchLabels:
      app: web
  ingress:
  - ports:
    - port: 80
`
	nodeOne = `apiVersion: v1
kind: Node
metadata:
  name: node-1
spec:
  podCIDRs: ["10.244.1.0/24"]
status:
  addresses:
  - type: InternalIP
    address: 192.168.0.10
`
)

// policy returns a valid NetworkPolicy manifest.
func policy(ns, name string) string {
	return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: " + name +
		"\n  namespace: " + ns + "\nspec:\n  podSelector: {}\n"
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// keys lists the objects of a state as "Kind key", sorted.
func keys(st *cluster.State) []string {
	var out []string
	for k := range st.Namespaces {
		out = append(out, "Namespace "+k)
	}
	for k := range st.Pods.Keys() {
		out = append(out, "Pod "+k)
	}
	for k := range st.Policies {
		out = append(out, "NetworkPolicy "+k)
	}
	for k := range st.Nodes {
		out = append(out, "Node "+k)
	}
	for k := range st.ClusterPolicies {
		out = append(out, "ClusterNetworkPolicy "+k)
	}
	slices.Sort(out)
	return out
}

func errStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// checkErrors requires one error per wanted substring, in order. "DIR" in a wanted string is
// replaced by the test directory.
func checkErrors(t *testing.T, dir string, errs []error, want []string) {
	t.Helper()
	got := errStrings(errs)
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		w = strings.ReplaceAll(w, "DIR", dir)
		if !strings.Contains(got[i], w) {
			t.Errorf("error %d:\n got  %s\n want substring %s", i, got[i], w)
		}
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		want     []string // object keys
		wantErrs []string // substrings, one per error in order
		wantLog  []string // substrings of the log output
	}{
		{
			name: "multi-document YAML with empty documents and comments",
			files: map[string]string{"all.yaml": "---\n# leading comment\n---\n" + nsFoo + "---\n---\n# only a comment\n---\n" +
				podWeb + "--- # comment after separator\n" + policyAllowWeb + "---\n" + nodeOne + "---\n"},
			want: []string{"Namespace foo", "NetworkPolicy default/allow-web", "Node node-1", "Pod foo/web"},
		},
		{
			name:  "yml extension and CRLF line endings",
			files: map[string]string{"a.yml": strings.ReplaceAll(nsFoo+"---\n"+nodeOne, "\n", "\r\n")},
			want:  []string{"Namespace foo", "Node node-1"},
		},
		{
			name: "List",
			files: map[string]string{"list.yaml": `apiVersion: v1
kind: List
metadata: {}
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: foo}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: p1, namespace: foo}
  spec: {podSelector: {}}
`},
			want: []string{"Namespace foo", "NetworkPolicy foo/p1"},
		},
		{
			name: "typed list items without kind",
			files: map[string]string{"pods.yaml": `apiVersion: v1
kind: PodList
items:
- metadata: {name: a, namespace: foo}
- apiVersion: v1
  kind: Pod
  metadata: {name: b, namespace: foo}
`},
			want: []string{"Pod foo/a", "Pod foo/b"},
		},
		{
			name: "JSON object, JSON List and a JSON stream",
			files: map[string]string{
				"a.json": `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"foo"}}`,
				"b.json": `{"apiVersion":"v1","kind":"List","items":[
					{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"p1","namespace":"foo"},"spec":{"podSelector":{}}},
					{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}]}`,
				"c.json": `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bar"}}
null
{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"baz"}}`,
			},
			want: []string{"Namespace bar", "Namespace baz", "Namespace foo", "NetworkPolicy foo/p1", "Node n1"},
		},
		{
			name: "dot files, other extensions and subdirectories are ignored",
			files: map[string]string{
				"a.yaml":                  nsFoo,
				".a.yaml.swp":             "garbage: [",
				".hidden.yaml":            "garbage: [",
				"..2024_01_01/b.yaml":     policy("foo", "in-subdir"),
				"sub/c.yaml":              policy("foo", "in-subdir2"),
				"README.md":               "# not a manifest",
				"a.yaml~":                 "garbage: [",
				"notes.txt":               "garbage: [",
				"empty.yaml":              "",
				"only-comments.yaml":      "# nothing\n",
				"upper.YAML":              policy("foo", "upper"),
				"bom.yaml":                "\xef\xbb\xbf" + policy("foo", "bom"),
				"whitespace-only.json":    "  \n",
				"separators-only.yaml":    "---\n---\n",
				"trailing-document.yml":   policy("foo", "trailing") + "...\n",
				"z-last.yaml":             "",
				"deeper/nested/ns.yaml":   nsFoo,
				"..data/ignored-too.yaml": nsFoo,
			},
			want: []string{"Namespace foo", "NetworkPolicy foo/bom", "NetworkPolicy foo/trailing", "NetworkPolicy foo/upper"},
		},
		{
			name: "unsupported kinds are skipped with a log line",
			files: map[string]string{"mixed.yaml": nsFoo + `---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {whatever: true}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: svc}
`},
			want:    []string{"Namespace foo"},
			wantLog: []string{"document=2 kind=Deployment apiVersion=apps/v1", "document=3 kind=Service apiVersion=v1 item=0"},
		},
		{
			name: "unknown field is an error naming the field",
			files: map[string]string{"p.yaml": `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: p1
  namespace: foo
spec:
  podSelectr: {}
  ingress:
  - from:
    - podSelector: {}
      namespaceSelectr: {}
`},
			wantErrs: []string{
				`DIR/p.yaml: document 1 (NetworkPolicy foo/p1): unknown field "spec.ingress[0].from[0].namespaceSelectr"`,
				`DIR/p.yaml: document 1 (NetworkPolicy foo/p1): unknown field "spec.podSelectr"`,
			},
		},
		{
			name:  "field names are case sensitive",
			files: map[string]string{"p.yaml": "apiVersion: v1\nkind: Namespace\nMetadata:\n  name: foo\n"},
			wantErrs: []string{
				`DIR/p.yaml: document 1 (Namespace): unknown field "Metadata"`,
				`DIR/p.yaml: document 1 (Namespace): metadata.name: Required value`,
			},
		},
		{
			name:     "duplicate YAML key",
			files:    map[string]string{"p.yaml": nsFoo + "---\n" + "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: bar\nmetadata:\n  name: baz\n"},
			wantErrs: []string{`DIR/p.yaml: document 2: invalid YAML: `},
		},
		{
			name: "validation error names file, document, object and field",
			files: map[string]string{"policies.yaml": policy("default", "a") + "---\n" + policy("default", "b") + "---\n" +
				strings.Replace(policyAllowWeb, "port: 80", "port: 70000", 1)},
			wantErrs: []string{`DIR/policies.yaml: document 3 (NetworkPolicy default/allow-web): spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and 65535`},
		},
		{
			name: "several validation errors in one object",
			files: map[string]string{"pod.yaml": `apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - ports:
    - containerPort: 0
      protocol: ICMP
status:
  podIPs: [{ip: 10.0.0.1}, {ip: 10.0.0.2}]
`},
			wantErrs: []string{
				`DIR/pod.yaml: document 1 (Pod default/web): status.podIPs[1].ip: Invalid value: "10.0.0.2": at most one IP per family`,
				`DIR/pod.yaml: document 1 (Pod default/web): spec.containers[0].ports[0].containerPort: Invalid value: 0`,
				`DIR/pod.yaml: document 1 (Pod default/web): spec.containers[0].ports[0].protocol: Unsupported value: "ICMP"`,
			},
		},
		{
			name:  "error in one document drops the whole file on first load",
			files: map[string]string{"a.yaml": nsFoo + "---\n" + "apiVersion: v1\nkind: Node\nmetadata: {name: Bad_Name}\n", "b.yaml": nodeOne},
			want:  []string{"Node node-1"},
			wantErrs: []string{
				`DIR/a.yaml: document 2 (Node Bad_Name): metadata.name: Invalid value: "Bad_Name"`,
			},
		},
		{
			name: "List item errors name the item",
			files: map[string]string{"list.yaml": nsFoo + `---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: ok}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: p1, namespace: foo}
  spec:
    podSelector: {}
    egress:
    - to: [{ipBlock: {cidr: 10.0.0.0/33}}]
- kind: Pod
  metadata: {name: x}
`},
			wantErrs: []string{
				`DIR/list.yaml: document 2, items[1] (NetworkPolicy foo/p1): spec.egress[0].to[0].ipBlock.cidr: Invalid value: "10.0.0.0/33"`,
				`DIR/list.yaml: document 2, items[2] (Pod default/x): apiVersion: Required value`,
			},
		},
		{
			name: "missing kind and apiVersion, wrong apiVersion, not an object",
			files: map[string]string{"bad.yaml": `metadata: {name: x}
---
apiVersion: networking.k8s.io/v1beta1
kind: NetworkPolicy
metadata: {name: p}
---
apiVersion: networking.k8s.io/v1
kind: List
items: []
---
- a
- b
---
just a string
`},
			wantErrs: []string{
				`DIR/bad.yaml: document 1: kind: Required value`,
				`DIR/bad.yaml: document 1: apiVersion: Required value`,
				`DIR/bad.yaml: document 2 (NetworkPolicy default/p): apiVersion: Unsupported value: "networking.k8s.io/v1beta1": supported values: "networking.k8s.io/v1"`,
				`DIR/bad.yaml: document 3 (List): apiVersion: Unsupported value: "networking.k8s.io/v1"`,
				`DIR/bad.yaml: document 4: not an object`,
				`DIR/bad.yaml: document 5: not an object`,
			},
		},
		{
			name: "nested List and wrong item kind in a typed list",
			files: map[string]string{"l.yaml": `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: List
  items: []
---
apiVersion: v1
kind: PodList
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: foo}
`},
			wantErrs: []string{
				`DIR/l.yaml: document 1, items[0] (List): a List may not be nested in a List`,
				`DIR/l.yaml: document 2, items[0] (Namespace foo): kind: Invalid value: "Namespace": items of a PodList must be Pod`,
			},
		},
		{
			name:     "unknown field in a List",
			files:    map[string]string{"l.yaml": "apiVersion: v1\nkind: List\nitemz: []\n"},
			wantErrs: []string{`DIR/l.yaml: document 1 (List): unknown field "itemz"`},
		},
		{
			name:     "wrong type",
			files:    map[string]string{"pod.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - ports:\n    - containerPort: http\n"},
			wantErrs: []string{`DIR/pod.yaml: document 1 (Pod default/x): json: cannot unmarshal string into Go struct field`},
		},
		{
			name:  "YAML booleans where a string is expected",
			files: map[string]string{"a.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: foo\n  labels: {enabled: yes}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n}\n"},
			wantErrs: []string{
				`DIR/a.yaml: document 1 (Namespace foo): json: cannot unmarshal bool into Go struct field ObjectMeta.metadata.labels of type string (YAML reads unquoted y, n, yes, no, on, off, true and false as booleans: quote the value)`,
				`DIR/a.yaml: document 2: json: cannot unmarshal bool into Go struct field .metadata.name of type string (YAML reads`,
			},
		},
		{
			name:     "bad YAML names the line in the file",
			files:    map[string]string{"bad.yaml": nsFoo + "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: x\n labels: [\n"},
			wantErrs: []string{`DIR/bad.yaml: document 2: invalid YAML: yaml: line 11: did not find expected key`},
		},
		{
			name:     "bad JSON",
			files:    map[string]string{"bad.json": "{\"apiVersion\": \"v1\",\n \"kind\": \"Namespace\",,\n}"},
			wantErrs: []string{`DIR/bad.json: document 1: invalid JSON at line 2: invalid character ','`},
		},
		{
			name:     "JSON unknown field",
			files:    map[string]string{"ns.json": `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"foo","labelz":{}}}`},
			wantErrs: []string{`DIR/ns.json: document 1 (Namespace foo): unknown field "metadata.labelz"`},
		},
		{
			name:     "duplicate inside one file",
			files:    map[string]string{"a.yaml": nsFoo + "---\napiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(strings.TrimSpace(nsFoo), "\n", "\n  ") + "\n"},
			wantErrs: []string{`DIR/a.yaml: document 2, items[0] (Namespace foo): duplicate Namespace foo: also defined in document 1 of this file`},
		},
		{
			name: "duplicate across files: the lexically first file wins on first load",
			files: map[string]string{
				"a.yaml": policy("foo", "p1"),
				"b.yaml": policy("foo", "p2") + "---\n" + policy("foo", "p1"),
				"c.yaml": policy("foo", "p3"),
			},
			want:     []string{"NetworkPolicy foo/p1", "NetworkPolicy foo/p3"},
			wantErrs: []string{`DIR/b.yaml: document 2 (NetworkPolicy foo/p1): duplicate NetworkPolicy foo/p1: also defined in DIR/a.yaml (document 1); this file is not applied`},
		},
		{
			name: "same name in different namespaces or kinds is not a duplicate",
			files: map[string]string{
				"a.yaml": policy("foo", "x") + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n",
				"b.yaml": policy("bar", "x") + "---\napiVersion: v1\nkind: Node\nmetadata: {name: x}\n",
			},
			want: []string{"Namespace x", "NetworkPolicy bar/x", "NetworkPolicy foo/x", "Node x"},
		},
		{
			name: "cluster-scoped objects ignore metadata.namespace",
			files: map[string]string{
				"a.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: foo, namespace: bar}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-x, namespace: bar}\n",
			},
			want: []string{"Namespace foo", "Node node-x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tt.files)
			var logs bytes.Buffer
			st, errs := Load(dir, slog.New(slog.NewTextHandler(&logs, nil)))
			if st == nil {
				t.Fatalf("nil state; errors: %v", errs)
			}
			checkErrors(t, dir, errs, tt.wantErrs)
			if got := keys(st); !slices.Equal(got, tt.want) {
				t.Errorf("objects:\n got  %q\n want %q", got, tt.want)
			}
			for _, w := range tt.wantLog {
				if !strings.Contains(logs.String(), w) {
					t.Errorf("log does not contain %q:\n%s", w, logs.String())
				}
			}
			for _, e := range errs {
				var me *Error
				if !errors.As(e, &me) {
					t.Errorf("error %v is not a *manifests.Error", e)
				}
			}
		})
	}
}

func TestLoadErrorFields(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"p.yaml": "# first\n" + policy("foo", "a") + "---\n" + strings.Replace(policyAllowWeb, "port: 80", "port: 0", 1)})
	_, errs := Load(dir, nil)
	if len(errs) != 1 {
		t.Fatalf("errors: %v", errs)
	}
	var e *Error
	if !errors.As(errs[0], &e) {
		t.Fatalf("not an *Error: %v", errs[0])
	}
	want := Error{File: filepath.Join(dir, "p.yaml"), Document: 2, Line: 10, Item: -1, Kind: "NetworkPolicy", Namespace: "default", Name: "allow-web", Field: "spec.ingress[0].ports[0].port"}
	got := *e
	got.Err = nil
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestLoadDefaulting(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": nsFoo + "---\n" + podWeb + "---\n" + policyAllowWeb + `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress, namespace: foo}
spec:
  podSelector: {}
  egress:
  - ports: [{port: 53, protocol: UDP}, {port: dns}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: explicit, namespace: foo}
spec:
  podSelector: {}
  policyTypes: [Egress]
---
apiVersion: v1
kind: Namespace
metadata: {name: bare}
`})
	st, errs := Load(dir, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := st.Namespaces["foo"].Labels; got[cluster.NamespaceNameLabel] != "foo" || got["team"] != "a" {
		t.Errorf("namespace foo labels: %v", got)
	}
	if got := st.Namespaces["bare"].Labels; got[cluster.NamespaceNameLabel] != "bare" {
		t.Errorf("namespace bare labels: %v", got)
	}
	pod := st.Pods.Get("foo/web")
	if len(pod.IPs) != 1 || pod.IPs[0].String() != "10.244.1.5" {
		t.Errorf("podIPs: %v", pod.IPs)
	}
	if p := pod.Ports[0].Protocol; p != corev1.ProtocolTCP {
		t.Errorf("container port protocol: %q", p)
	}
	web := st.Policies["default/allow-web"]
	if web == nil {
		t.Fatalf("policy without namespace not in default: %v", keys(st))
	}
	if web.Kind != "NetworkPolicy" || web.APIVersion != "networking.k8s.io/v1" {
		t.Errorf("TypeMeta: %+v", web.TypeMeta) // a pod keeps none (cluster.Pod)
	}
	if !slices.Equal(web.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("allow-web policyTypes: %v", web.Spec.PolicyTypes)
	}
	if p := web.Spec.Ingress[0].Ports[0].Protocol; p == nil || *p != corev1.ProtocolTCP {
		t.Errorf("allow-web port protocol: %v", p)
	}
	eg := st.Policies["foo/egress"]
	if !slices.Equal(eg.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("egress policyTypes: %v", eg.Spec.PolicyTypes)
	}
	if p := eg.Spec.Egress[0].Ports[0].Protocol; *p != corev1.ProtocolUDP {
		t.Errorf("egress port 0 protocol: %v", *p)
	}
	if p := eg.Spec.Egress[0].Ports[1].Protocol; *p != corev1.ProtocolTCP {
		t.Errorf("egress port 1 protocol: %v", *p)
	}
	if got := st.Policies["foo/explicit"].Spec.PolicyTypes; !slices.Equal(got, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Errorf("explicit policyTypes: %v", got)
	}
}

func TestLoadSymlinks(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	writeFiles(t, other, map[string]string{"ns.yaml": nsFoo, "sub/x.yaml": nodeOne})
	if err := os.Symlink(filepath.Join(other, "ns.yaml"), filepath.Join(dir, "ns.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "sub"), filepath.Join(dir, "dir.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "missing.yaml"), filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	st, errs := Load(dir, nil)
	checkErrors(t, dir, errs, []string{"DIR/dangling.yaml: no such file or directory"})
	if got, want := keys(st), []string{"Namespace foo"}; !slices.Equal(got, want) {
		t.Errorf("objects: got %q, want %q", got, want)
	}
}

func TestLoadMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nope")
	st, errs := Load(dir, nil)
	if st != nil {
		t.Errorf("state: %v", st)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), dir) || !strings.Contains(errs[0].Error(), "no such file or directory") {
		t.Errorf("errors: %v", errs)
	}
	file := filepath.Join(t.TempDir(), "file.yaml")
	writeFiles(t, filepath.Dir(file), map[string]string{"file.yaml": nsFoo})
	if _, errs := Load(file, nil); len(errs) != 1 || !strings.Contains(errs[0].Error(), file) {
		t.Errorf("errors for a file: %v", errs)
	}
}

func TestLoadUnreadableFile(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root can read any file")
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": nsFoo})
	if err := os.Chmod(filepath.Join(dir, "a.yaml"), 0); err != nil {
		t.Fatal(err)
	}
	_, errs := Load(dir, nil)
	checkErrors(t, dir, errs, []string{"DIR/a.yaml: permission denied"})
}

func TestLoadIgnoresFIFO(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": nsFoo})
	// Opening a FIFO for reading waits for a writer, which never comes.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, errs := Load(dir, nil)
	checkErrors(t, dir, errs, nil)
	if got, want := keys(st), []string{"Namespace foo"}; !slices.Equal(got, want) {
		t.Errorf("objects: got %q, want %q", got, want)
	}
	if got := slices.Sorted(maps.Keys(st.Revision.Files.Map())); !slices.Equal(got, []string{"a.yaml"}) {
		t.Errorf("files read: %q", got)
	}
}
