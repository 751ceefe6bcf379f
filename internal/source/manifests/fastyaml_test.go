package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// fastYAMLCases are documents the fast path converts (accept) or leaves to sigs.k8s.io/yaml.
var fastYAMLCases = []struct {
	doc    string
	accept bool
}{
	{nsFoo, true},
	{podWeb, true},
	{policyAllowWeb, true},
	{policy("foo", "bar"), true},
	{"", true},
	{"# only a comment\n\n", true},
	{"a: 1\nb: two\nc:\n", true},
	{"b: 1\na: 2\nc: {a: 1}\n", false},
	{"z: 1\nw: 2\nx:\n  d: 1\n  c: [1]\n", false},
	{"z: 1\nw: 2\nx:\n  d: 1\n  c: []\n  b: {}\n", true},
	{"a: 1\na: 2\n", false},
	{"b: 1\na: 2\nb: 3\n", false},
	{"list:\n- a\n- b\n-\n- - c\n  - d\n- p: 1\n  q:\n  - 2\n", true},
	{"list:\n- p: 1\n  y: 2\n", false}, // y is a boolean key
	{"list:\n  - a: 1\n    b: 2\n  -   c: 3\n      d: 4\n", true},
	{"a: y\nb: Yes\nc: on\nd: OFF\ne: n\nf: ~\ng: null\nh: NULL\ni: true\nj: False\n", true},
	{"a: 'y'\nb: \"no\"\nc: 'it''s'\nd: \"<&>\"\ne: '\"\\'\nf: ''\ng: \"\"\n", true},
	{"a: \"x\\ny\"\n", false},
	{"a: 'x\n  y'\n", false},
	{"a: x\n  y\n", false},
	{"a:\n  x\n  y\n", false},
	{"a:\n  x\nb: 1\n", true},
	{"a: 0\nb: 10\nc: 007\nd: 0x1f\ne: 1_000\nf: 1.5\ng: 1e3\nh: -1\ni: +1\nj: 123456789012345678\nk: 1234567890123456789\n", false},
	{"a: 0\nb: 10\nj: 123456789012345678\n", true},
	{"a: 10.244.0.3\nb: 10.0.0.0/8\nc: 2001:db8::1\nd: 12:30\ne: 1.2.3\ng: 80/TCP\n", true},
	{"a: 0b2\n", false}, // a string, but left to the slow path
	{"a: 2001-12-14\n", false},
	{"a: 2001-12-14t21:59:43.10-05:00\n", false},
	{"a: 1234-foo\n", false},
	{"a: .5\n", false},
	{"a: .inf\n", false},
	{"a: .foo\nb: ._x\n", true},
	{"a: x # comment\nb: 'y' # comment\nc: {} # comment\nd: # comment\n  e: 1\n", true},
	{"a: x#y\nb: x #y\n", true},
	{"a: b: c\n", false},
	{"a: b:\n", false},
	{"a: b:c\n", true},
	{"a: &x 1\nb: *x\n", false},
	{"a: !!str 1\n", false},
	{"a: |\n  text\n", false},
	{"a: >-\n  text\n", false},
	{"a: [1, 2]\n", false},
	{"a: {b: 1}\n", false},
	{"a:\tb\n", false},
	{"a: b\r\n", false},
	{"a: caf\xc3\xa9\n", false},
	{"? a\n: b\n", false},
	{"<<: {a: 1}\n", false},
	{"1: a\n", false},
	{"true: a\n", false},
	{"on: a\n", false},
	{"\"a\": b\n", false},
	{"a : b\n", false},
	{"- a\n- b\n", false},
	{"just a scalar\n", false},
	{"a: 1\n b: 2\n", false},
	{"a:\n    b: 1\n  c: 2\n", false},
	{"  a: 1\n  b:\n    c: 2\n", true},
	{"a: 1\n  # an indented comment\nb: 2\n", true},
	{"a: -x\n", false},
	{"a: -\n", false},
	{"a: x\n---\nb: y\n", false},
	{"%YAML 1.1\na: b\n", false},
	{"a: ---x\n", false},
	{"a: ...x\n", true},
	{"a: ~x\nb: yes please\nc: y2\n", true},
	{"a: some words  with  spaces\n", true},
	{"a: 'unterminated\n", false},
	{"a: \"unterminated\n", false},
	{"a: 'x' y\n", false},
	{"a: \"x\"y\n", false},
	{"-x: 1\n_y: 2\n.z: 3\n/w: 4\n", true},
	{"a:\n- 1\nb: 2\n", true},
	{"a:\n- 1\n- 2\nb:\n  - 3\n", true},
	{"a:\n- 1\n  - 2\n", false},
	{"a:\n  - 1\n - 2\n", false},
	{"x:\n  -\n    a: 1\n  - # c\n    b: 2\n", true},
	{"@x: 1\n", false},
	{"a: `x`\n", false},
	{"a: @x\n", false},
	{"a: %x\n", false},
}

// TestFastYAML checks that what the fast path converts, it converts to the very bytes
// sigs.k8s.io/yaml does, and that it converts the common manifests itself.
func TestFastYAML(t *testing.T) {
	c := new(fastYAML)
	for _, tc := range fastYAMLCases {
		got, hdr, ok := c.convert([]byte(tc.doc))
		if ok != tc.accept {
			t.Errorf("fast path accepted=%v, want %v, for:\n%s", ok, tc.accept, tc.doc)
		}
		if ok {
			checkSameJSON(t, tc.doc, got, hdr)
		}
	}
}

// checkSameJSON checks the fast path's JSON against sigs.k8s.io/yaml's, and the header it read
// (if any) against what the header decode finds in that JSON.
func checkSameJSON(t testing.TB, doc string, fast []byte, hdr *header) {
	t.Helper()
	want, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		t.Fatalf("fast path accepted a document sigs.k8s.io/yaml rejects (%v):\n%s", err, doc)
	}
	if !bytes.Equal(fast, want) {
		t.Fatalf("fast path: %s\nsigs.k8s.io/yaml: %s\nfor:\n%s", fast, want, doc)
	}
	if hdr == nil {
		return
	}
	var decoded header
	if err := sjson.UnmarshalCaseSensitivePreserveInts(want, &decoded); err != nil {
		t.Fatalf("fast path read a header from a document whose header decode fails (%v):\n%s", err, doc)
	}
	if *hdr != decoded {
		t.Fatalf("fast path read header %+v, the header decode %+v, for:\n%s", *hdr, decoded, doc)
	}
}

// TestFastYAMLHeader checks which headers the fast path reads itself.
func TestFastYAMLHeader(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want *header
	}{
		{podWeb, &header{APIVersion: "v1", Kind: "Pod", Metadata: struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		}{"web", "foo"}}},
		{"kind: 'Pod'\nspec:\n  metadata:\n    name: x\nmetadata:\n  labels:\n    name: y\n", &header{Kind: "Pod"}},
		{"kind: ~\napiVersion:\nmetadata:\n", &header{}},
		{"kind: 5\n", nil},
		{"kind: true\n", nil},
		{"kind: {}\n", nil},
		{"kind:\n- Pod\n", nil},
		{"metadata: x\n", nil},
		{"metadata: []\n", nil},
		{"metadata:\n- name: x\n", nil},
		{"metadata:\n  name: 1\n", nil},
		{"metadata:\n  namespace: '<ns>'\n", nil},
		{"metadata:\n  name:\n    first: x\n", nil},
	} {
		c := new(fastYAML)
		got, hdr, ok := c.convert([]byte(tc.doc))
		if !ok {
			t.Errorf("fast path did not convert:\n%s", tc.doc)
			continue
		}
		checkSameJSON(t, tc.doc, got, hdr)
		if (hdr == nil) != (tc.want == nil) || hdr != nil && *hdr != *tc.want {
			t.Errorf("header %+v, want %+v, for:\n%s", hdr, tc.want, tc.doc)
		}
	}
}

// TestFastYAMLFiles converts the repository's manifests and the benchmark cluster's files both
// ways.
func TestFastYAMLFiles(t *testing.T) {
	var docs []string
	for _, pattern := range []string{"../../../examples/*.yaml", "../../../deploy/*/*.yaml", "../../../deploy/*.yaml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range splitYAML(data) {
				docs = append(docs, string(ch.data))
			}
		}
	}
	if len(docs) == 0 {
		t.Fatal("no manifests found in the repository")
	}
	dir := t.TempDir()
	if _, err := synth.WriteObjectFiles(dir, synth.Generate(synth.Default())); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	synthDocs := 0
	for i, e := range entries {
		if i%50 != 0 && !strings.HasPrefix(e.Name(), "node-") { // a sample of each kind
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(data))
		synthDocs++
	}
	c := new(fastYAML)
	accepted := 0
	for i, doc := range docs {
		got, hdr, ok := c.convert([]byte(doc))
		if ok {
			accepted++
			checkSameJSON(t, doc, got, hdr)
		} else if i >= len(docs)-synthDocs {
			t.Errorf("fast path left a file of the benchmark cluster to the slow path:\n%s", doc)
		}
	}
	t.Logf("fast path converted %d of %d documents", accepted, len(docs))
}

// FuzzFastYAML: whatever the fast path converts, sigs.k8s.io/yaml converts to the same bytes.
func FuzzFastYAML(f *testing.F) {
	for _, tc := range fastYAMLCases {
		f.Add(tc.doc)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		c := new(fastYAML)
		if got, hdr, ok := c.convert([]byte(doc)); ok {
			checkSameJSON(t, doc, got, hdr)
		}
	})
}
