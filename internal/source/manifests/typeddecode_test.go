package manifests

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// typedCases are documents of the kinds the typed decoder reads, and whether it reads them
// (accept) or leaves them to the strict decode.
var typedCases = []struct {
	kind, doc string
	accept    bool
}{
	{kindNamespace, nsFoo, true},
	{kindPod, podWeb, true},
	{kindPolicy, policyAllowWeb, true},
	{kindPolicy, policy("foo", "bar"), true},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels: {}\n  annotations:\n    x: z\n  creationTimestamp: null\nspec:\n  finalizers: [kubernetes]\nstatus:\n  phase: Active\n", true},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\nspec:\n  finalizers: []\n", true},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  creationTimestamp: \"2024-01-01T00:00:00Z\"\n", false},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  Name: b\n", false},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels:\n    x: null\n", false},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels:\n    x: 1\n", false},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  uid: 0a1b\n  resourceVersion: \"7\"\n  generation: 3\n  generateName: a-\n", true},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  generation: 9223372036854775808\n", false},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: \"caf\\u00e9\"\n", false},
	{kindNamespace, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\nunknown: 1\n", false},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns1\nspec:\n  hostNetwork: true\n  nodeName: n1\n  restartPolicy: Always\n  dnsPolicy: ClusterFirst\n  schedulerName: default-scheduler\n  serviceAccountName: sa\n  terminationGracePeriodSeconds: 30\n  initContainers: []\n  containers:\n  - name: c\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c]\n    args: []\n    workingDir: /\n    terminationMessagePath: /dev/termination-log\n    terminationMessagePolicy: File\n    resources: {}\n    ports:\n    - containerPort: 53\n      hostPort: 5353\n      hostIP: 127.0.0.1\n      protocol: UDP\n      name: dns\n    - containerPort: 8080\nstatus:\n  phase: Pending\n  podIP: 10.0.0.1\n  podIPs: [{ip: 10.0.0.1}, {ip: \"fd00::1\"}]\n  hostIP: 192.0.2.1\n  hostIPs: []\n", true},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    resources:\n      limits:\n        cpu: 100m\n", false},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    ports:\n    - containerPort: 2147483648\n", false},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    ports:\n    - containerPort: \"80\"\n", false},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  hostNetwork: \"true\"\n", false},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  tolerations: []\n", false},
	{kindPod, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nstatus:\n  podIPs:\n  - ip: 10.0.0.1\n    other: x\n", false},
	{kindPolicy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: a\nspec:\n  podSelector:\n    matchExpressions:\n    - key: app\n      operator: In\n      values: [a, b]\n    - key: x\n      operator: Exists\n      values: []\n  policyTypes: [Ingress, Egress]\n  ingress:\n  - {}\n  - from: []\n    ports: []\n  - from:\n    - ipBlock:\n        cidr: 10.0.0.0/8\n        except: [10.1.0.0/16]\n    - podSelector: {}\n      namespaceSelector:\n        matchLabels: {}\n    ports:\n    - port: 80\n    - port: http\n      protocol: TCP\n    - port: 1000\n      endPort: 2000\n      protocol: SCTP\n    - protocol: UDP\n  egress:\n  - to:\n    - ipBlock:\n        cidr: fd00::/8\n        except: []\n  - ports:\n    - port: -1\n", true},
	{kindPolicy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: a\nspec:\n  ingress: []\n  egress: []\n  policyTypes: []\n  podSelector:\n    matchLabels:\n      a: b\n    matchExpressions: []\n", true},
	{kindPolicy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: a\nspec:\n  podSelector: null\n", false},
	{kindPolicy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: a\nspec:\n  ingress:\n  - ports:\n    - port: 80.5\n", false},
	{kindPolicy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: a\nspec:\n  ingress:\n  - ports:\n    - port: 2147483648\n", false},
	{kindPolicy, `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a"},"spec":{"ingress":[{"ports":[{"port":80,"port":81}]}]}}`, false},
	{kindPolicy, `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a","labels":{"a":"b","a":"c"}}}`, false},
	{kindPolicy, `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a"},"metadata":{"name":"a"}}`, false},
	{kindPolicy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: a\nstatus: {}\n", false},
}

// toJSON converts a YAML document as the loader does when the fast path cannot.
func toJSON(t testing.TB, doc string) []byte {
	t.Helper()
	if strings.HasPrefix(doc, "{") {
		return []byte(doc) // JSON as written, for what YAML cannot say (a doubled key)
	}
	j, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return j
}

// checkTyped decodes raw both ways. When the typed decoder accepts raw, the strict decode must
// accept it too, with no unknown or duplicate field, and return an equal object.
func checkTyped(t testing.TB, kind string, raw []byte) (accepted bool) {
	t.Helper()
	got, ok := decodeTyped(kind, raw)
	if !ok {
		return false
	}
	want, strict, err := kinds[kind].decode(raw)
	if err != nil || len(strict) > 0 {
		t.Fatalf("typed decode accepted what the strict decode rejects (%v, %v):\n%s", err, strict, raw)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("typed decode differs from the strict decode:\n got  %#v\n want %#v\n%s", got, want, raw)
	}
	return true
}

func TestTypedDecodeCases(t *testing.T) {
	for i, c := range typedCases {
		raw := toJSON(t, c.doc)
		if got := checkTyped(t, c.kind, raw); got != c.accept {
			t.Errorf("case %d: accepted %v, want %v:\n%s", i, got, c.accept, c.doc)
		}
		// The JSON that the fast YAML path writes must be read the same way.
		if j, _, ok := new(fastYAML).convert([]byte(c.doc)); ok {
			if !bytes.Equal(j, raw) {
				t.Fatalf("case %d: fast YAML path converts differently", i)
			}
		}
	}
	// Indented JSON, as a .json file has it.
	var pretty bytes.Buffer
	pretty.WriteString("{\n  \"kind\": \"Namespace\" ,\n\t\"apiVersion\":\"v1\",\r\n \"metadata\" : { \"name\" : \"x\" , \"labels\" : { \"a\" : \"b\" } } }\n")
	if !checkTyped(t, kindNamespace, pretty.Bytes()) {
		t.Errorf("indented JSON not accepted")
	}
	for _, bad := range []string{`{"kind":"Namespace"`, `{"kind":"Namespace"}}`, `{"kind":"Namespace",}`, `{"kind" "Namespace"}`, `["kind"]`, ``} {
		if _, ok := decodeTyped(kindNamespace, []byte(bad)); ok {
			t.Errorf("malformed %q accepted", bad)
		}
	}
}

// typedCorpus returns JSON documents of the three kinds: the cases above, the benchmark
// cluster's objects and the manifests under examples/.
func typedCorpus(t testing.TB) (kindsOf []string, docs [][]byte) {
	t.Helper()
	add := func(kind string, raw []byte) {
		kindsOf, docs = append(kindsOf, kind), append(docs, raw)
	}
	for _, c := range typedCases {
		add(c.kind, toJSON(t, c.doc))
	}
	spec := synth.Default()
	spec.Namespaces, spec.Pods, spec.Policies, spec.LocalPods = 20, 60, 200, 10
	dir := t.TempDir()
	if _, err := synth.WriteObjectFiles(dir, synth.Generate(spec)); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	examples, _ := filepath.Glob("../../../examples/*.yaml")
	if len(examples) == 0 {
		t.Fatal("no manifests under examples/")
	}
	for _, f := range append(files, examples...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range splitYAML(data) {
			if len(bytes.TrimSpace(c.data)) == 0 {
				continue
			}
			var hdr header
			raw := toJSON(t, string(c.data))
			if err := yaml.Unmarshal(c.data, &hdr); err != nil {
				continue // not an object
			}
			if hdr.Kind == kindNamespace || hdr.Kind == kindPod || hdr.Kind == kindPolicy {
				add(hdr.Kind, raw)
			}
		}
	}
	return kindsOf, docs
}

func TestTypedDecodeCorpus(t *testing.T) {
	kindsOf, docs := typedCorpus(t)
	accepted := 0
	for i, raw := range docs {
		if checkTyped(t, kindsOf[i], raw) {
			accepted++
		}
	}
	// The benchmark cluster is what a cold start reads: all of it must take the typed path.
	if accepted < len(docs)-len(typedCases) {
		t.Errorf("typed decode accepted %d of %d documents", accepted, len(docs))
	}
}

// mutate returns raw with one random edit of the kinds that make a document differ from what
// the typed decoder reads: bytes removed or inserted, a value retyped, a key renamed or doubled.
func mutate(r *rand.Rand, raw []byte) []byte {
	out := bytes.Clone(raw)
	at := r.IntN(len(out))
	switch r.IntN(7) {
	case 0:
		return append(out[:at], out[at+1:]...)
	case 1:
		ins := []string{`"`, `,`, `:`, `{`, `}`, `[`, `]`, ` `, `\`, `null`, `0`, `-`, `"x":"y",`, `"a":1,`, "\xc3\xa9"}[r.IntN(15)]
		return append(out[:at], append([]byte(ins), out[at:]...)...)
	case 2: // a string value becomes a number, a boolean, null, an object or an array
		i := bytes.Index(out[at:], []byte(`":"`))
		if i < 0 {
			return out
		}
		i += at + 2
		j := bytes.IndexByte(out[i+1:], '"')
		if j < 0 {
			return out
		}
		repl := []string{`1`, `true`, `null`, `{}`, `[]`, `"1"`, `-7`, `1e2`}[r.IntN(8)]
		return append(out[:i], append([]byte(repl), out[i+j+2:]...)...)
	case 3: // a number becomes a string or an out-of-range or fractional number
		i := bytes.IndexAny(out[at:], "0123456789")
		if i < 0 {
			return out
		}
		i += at
		repl := []string{`"80"`, `99999999999`, `1.5`, `0`, `007`, `-0`}[r.IntN(6)]
		return append(out[:i], append([]byte(repl), out[i+1:]...)...)
	case 4: // a key changes case
		i := bytes.Index(out[at:], []byte(`":`))
		if i < 0 || i == 0 {
			return out
		}
		i += at - 1
		out[i] ^= 0x20
		return out
	case 5: // a key-value pair is doubled
		i := bytes.IndexByte(out[at:], ',')
		if i < 0 {
			return out
		}
		i += at
		start := bytes.LastIndexAny(out[:i], "{,")
		if start < 0 {
			return out
		}
		pair := bytes.Clone(out[start+1 : i])
		return append(out[:i+1], append(append(pair, ','), out[i+1:]...)...)
	default: // an empty collection appears
		repl := []string{`[]`, `{}`}[r.IntN(2)]
		i := bytes.IndexAny(out[at:], "[{")
		if i < 0 {
			return out
		}
		i += at
		end := bytes.IndexAny(out[i:], "]}")
		if end < 0 {
			return out
		}
		return append(out[:i], append([]byte(repl), out[i+end+1:]...)...)
	}
}

// TestTypedDecodeMutations checks the typed decoder against the strict decode on documents
// edited at random: whatever the typed decoder accepts must decode to the same object.
func TestTypedDecodeMutations(t *testing.T) {
	kindsOf, docs := typedCorpus(t)
	r := rand.New(rand.NewPCG(1, 2))
	n := 30000
	if testing.Short() {
		n = 3000
	}
	accepted := 0
	for range n {
		i := r.IntN(len(docs))
		raw := docs[i]
		for range 1 + r.IntN(3) {
			raw = mutate(r, raw)
			if len(raw) == 0 {
				break
			}
		}
		if len(raw) > 0 && checkTyped(t, kindsOf[i], raw) {
			accepted++
		}
	}
	// Some edits keep a document readable (a value changed, an empty list): the comparison
	// must have been made on those too.
	if accepted < n/20 {
		t.Fatalf("only %d of %d edited documents took the typed path", accepted, n)
	}
	t.Logf("%d of %d edited documents took the typed path", accepted, n)
}

func FuzzTypedDecode(f *testing.F) {
	kindsOf, docs := typedCorpus(f)
	all := []string{kindNamespace, kindPod, kindPolicy}
	for i, d := range docs {
		f.Add(slices.Index(all, kindsOf[i]), d)
	}
	f.Fuzz(func(t *testing.T, k int, raw []byte) {
		if k < 0 || k >= len(all) {
			return
		}
		checkTyped(t, all[k], raw)
	})
}
