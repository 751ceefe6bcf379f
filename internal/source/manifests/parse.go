package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sjson "sigs.k8s.io/json"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/cluster"
)

// The kinds the agent reads.
const (
	kindNamespace = "Namespace"
	kindPod       = "Pod"
	kindPolicy    = "NetworkPolicy"
	kindNode      = "Node"
	kindCNP       = "ClusterNetworkPolicy"
)

// The ClusterNetworkPolicy versions read. v1alpha2 has the schema of v1beta1 (the CRD serves both
// and converts with no webhook), so both decode into v1beta1, which is what the agent keeps.
const (
	cnpV1beta1  = "policy.networking.k8s.io/v1beta1"
	cnpV1alpha2 = "policy.networking.k8s.io/v1alpha2"
)

// objKind numbers the kinds the agent reads, for objKey.
type objKind uint8

const (
	objNamespace objKind = iota
	objPod
	objPolicy
	objNode
	objCNP
)

var objKindNames = [...]string{objNamespace: kindNamespace, objPod: kindPod, objPolicy: kindPolicy, objNode: kindNode, objCNP: kindCNP}

func (k objKind) String() string { return objKindNames[k] }

// kindInfo describes how to decode, default and validate one supported kind.
type kindInfo struct {
	id objKind
	// apiVersions are the versions accepted; objects are converted to the first.
	apiVersions []string
	namespaced  bool
	// decode strictly decodes raw JSON. err is a hard decoding error (the object is unusable);
	// strict lists unknown and duplicate fields (the object is populated regardless).
	decode func(raw []byte) (obj metav1.Object, strict []error, err error)
	// prepare sets TypeMeta, clears metadata.namespace on cluster-scoped objects (as the API
	// server does), applies the cluster defaulting and returns the validation errors.
	prepare func(obj metav1.Object) field.ErrorList
	// strip returns a prepared, valid object with only what the agent reads (and its TypeMeta),
	// as the API source keeps: a file's last good content stays in memory as long as it is in
	// effect. Its equal parts are shared with other objects through in.
	strip func(in *cluster.Interner, obj metav1.Object) metav1.Object
}

func newKind[T any, PT interface {
	*T
	metav1.Object
}, S metav1.Object](id objKind, apiVersions []string, namespaced bool, setType func(PT, metav1.TypeMeta), def func(PT), validate func(PT) field.ErrorList, strip func(*cluster.Interner, PT) S) kindInfo {
	typeMeta := metav1.TypeMeta{Kind: id.String(), APIVersion: apiVersions[0]}
	return kindInfo{
		id:          id,
		apiVersions: apiVersions,
		namespaced:  namespaced,
		decode: func(raw []byte) (metav1.Object, []error, error) {
			obj := PT(new(T))
			strict, err := sjson.UnmarshalStrict(raw, obj)
			return obj, strict, err
		},
		prepare: func(o metav1.Object) field.ErrorList {
			obj := o.(PT)
			setType(obj, typeMeta)
			if !namespaced {
				obj.SetNamespace("")
			}
			def(obj)
			return validate(obj)
		},
		strip: func(in *cluster.Interner, o metav1.Object) metav1.Object {
			obj := strip(in, o.(PT))
			if typed, ok := any(obj).(PT); ok {
				setType(typed, typeMeta)
			}
			return obj
		},
	}
}

var (
	core = []string{"v1"}
	cnp  = []string{cnpV1beta1, cnpV1alpha2}
)

var kinds = map[string]kindInfo{
	kindNamespace: newKind(objNamespace, core, false,
		func(o *corev1.Namespace, tm metav1.TypeMeta) { o.TypeMeta = tm }, cluster.DefaultNamespace, cluster.ValidateNamespace, (*cluster.Interner).StripNamespace),
	kindPod: newKind(objPod, core, true,
		func(o *corev1.Pod, tm metav1.TypeMeta) { o.TypeMeta = tm }, cluster.DefaultPod, cluster.ValidatePod, (*cluster.Interner).Pod),
	kindPolicy: newKind(objPolicy, []string{"networking.k8s.io/v1"}, true,
		func(o *networkingv1.NetworkPolicy, tm metav1.TypeMeta) { o.TypeMeta = tm }, cluster.DefaultNetworkPolicy, cluster.ValidateNetworkPolicy, (*cluster.Interner).StripNetworkPolicy),
	kindNode: newKind(objNode, core, false,
		func(o *corev1.Node, tm metav1.TypeMeta) { o.TypeMeta = tm }, func(*corev1.Node) {}, cluster.ValidateNode, (*cluster.Interner).StripNode),
	kindCNP: newKind(objCNP, cnp, false,
		func(o *npav1beta1.ClusterNetworkPolicy, tm metav1.TypeMeta) { o.TypeMeta = tm }, stripClusterPolicy, cluster.ValidateClusterNetworkPolicy,
		func(_ *cluster.Interner, o *npav1beta1.ClusterNetworkPolicy) *npav1beta1.ClusterNetworkPolicy {
			return o
		}),
}

// decodeTyped decodes raw with the typedDecoder when its kind has one and raw is within what it
// reads; false leaves raw to the strict decode.
func decodeTyped(kind string, raw []byte) (metav1.Object, bool) {
	switch kind {
	case kindNamespace:
		return decodeNamespace(raw)
	case kindPod:
		return decodePod(raw)
	case kindPolicy:
		return decodePolicy(raw)
	}
	return nil, false
}

// stripClusterPolicy drops what the agent does not use (status, annotations, managed fields...),
// as the API source's transform does: at thousands of objects a file's last good content is
// held in memory as long as it is in effect.
func stripClusterPolicy(o *npav1beta1.ClusterNetworkPolicy) {
	o.ObjectMeta = metav1.ObjectMeta{Name: o.Name, Labels: o.Labels, Annotations: cluster.KeptAnnotations(o.Annotations),
		UID: o.UID, ResourceVersion: o.ResourceVersion, Generation: o.Generation}
	o.Status = npav1beta1.ClusterNetworkPolicyStatus{}
}

// listKinds maps the list kinds that are accepted to their apiVersions and the kind of their
// items ("" for the generic List, whose items carry their own apiVersion and kind).
var listKinds = map[string]struct {
	apiVersions []string
	itemKind    string
}{
	"List":                     {core, ""},
	"NamespaceList":            {core, kindNamespace},
	"PodList":                  {core, kindPod},
	"NetworkPolicyList":        {[]string{"networking.k8s.io/v1"}, kindPolicy},
	"NodeList":                 {core, kindNode},
	"ClusterNetworkPolicyList": {cnp, kindCNP},
}

// objKey identifies an object across files: its kind, and its key in the State's map of that
// kind (namespace/name, or the name of a cluster-scoped object), the very string the map is
// keyed by, so that one copy serves both.
type objKey struct {
	id   string
	kind objKind
}

func keyOf(kind objKind, namespaced bool, ns, name string) objKey {
	if namespaced {
		return objKey{id: cluster.Key(ns, name), kind: kind}
	}
	return objKey{id: name, kind: kind}
}

func (k objKey) String() string { return k.kind.String() + " " + k.id }

// nsName returns the namespace (empty for a cluster-scoped kind) and name of k.
func (k objKey) nsName() (ns, name string) {
	switch k.kind {
	case objPod, objPolicy:
		// A namespace has no "/" (it is a DNS label).
		ns, name, _ = strings.Cut(k.id, "/")
		return ns, name
	}
	return "", k.id
}

// object is one good, defaulted and validated object read from a file. It is never mutated after
// parsing: the same pointer is shared by every State built while its file's content is unchanged.
// Thousands are held, so it keeps what it must and nothing twice: where it is in its file
// without the file (see loc), and its sum only once one was needed.
type object struct {
	key objKey
	obj metav1.Object
	// doc, line and item are those of its location.
	doc, line, item int32
	// sum is the hash of the object's JSON, for change detection, computed when first needed
	// (a cold start compares none). Only the loader's update reads it.
	sum *[sha256.Size]byte
}

// loc returns where o is, in the file at path.
func (o *object) loc(path string) location {
	ns, name := o.key.nsName()
	return location{file: path, doc: int(o.doc), line: int(o.line), item: int(o.item), kind: o.key.kind.String(), ns: ns, name: name}
}

// sameAs reports whether o and other are equal objects (by their sums).
func (o *object) sameAs(other *object) bool {
	return o.digest() && other.digest() && *o.sum == *other.sum
}

// digest computes the object's sum if needed; false if it cannot be computed (never for the
// kinds read): the object is then taken as changed.
func (o *object) digest() bool {
	if o.sum == nil {
		b, err := json.Marshal(o.obj)
		if err != nil {
			return false
		}
		sum := sha256.Sum256(b)
		o.sum = &sum
	}
	return true
}

// fileContent is the result of parsing one file's bytes.
type fileContent struct {
	sum     [sha256.Size]byte
	objects []*object
	errs    []error
}

// parser parses one file.
type parser struct {
	in     *cluster.Interner
	isYAML bool
	path   string
	logger *slog.Logger
	objs   []*object
	errs   []error
	seen   map[objKey]*object
}

// parseFile parses the content of one manifest file, whose hash is sum. isJSON selects JSON (a
// stream of values) rather than multi-document YAML.
func parseFile(path string, data []byte, sum [sha256.Size]byte, isJSON bool, in *cluster.Interner, logger *slog.Logger) *fileContent {
	p := &parser{in: in, isYAML: !isJSON, path: path, logger: logger, seen: map[objKey]*object{}}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // UTF-8 byte order mark
	if isJSON {
		p.parseJSON(data)
	} else {
		p.parseYAML(data)
	}
	return &fileContent{sum: sum, objects: p.objs, errs: p.errs}
}

func (p *parser) parseJSON(data []byte) {
	dec := json.NewDecoder(bytes.NewReader(data))
	doc := 0
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if err == io.EOF {
			return
		}
		if err != nil {
			loc := location{file: p.path, doc: doc + 1, item: -1}
			var se *json.SyntaxError
			if errors.As(err, &se) {
				p.errs = append(p.errs, loc.errorf("invalid JSON at line %d: %v", lineOf(data, se.Offset), err))
			} else {
				p.errs = append(p.errs, loc.errorf("invalid JSON: %v", err))
			}
			return
		}
		if string(raw) == "null" {
			continue
		}
		doc++
		p.parseObject(raw, nil, location{file: p.path, doc: doc, item: -1}, "", "")
	}
}

func lineOf(data []byte, offset int64) int {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	return bytes.Count(data[:offset], []byte("\n")) + 1
}

func (p *parser) parseYAML(data []byte) {
	fast := fastYAMLPool.Get().(*fastYAML)
	defer fastYAMLPool.Put(fast)
	doc := 0
	for _, c := range splitYAML(data) {
		j, hdr, ok := fast.convert(c.data)
		var err error
		if !ok {
			j, err = yaml.YAMLToJSONStrict(c.data)
		}
		if err != nil {
			doc++
			loc := location{file: p.path, doc: doc, line: c.line, item: -1}
			p.errs = append(p.errs, loc.err(yamlError(err, c.line)))
			continue
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
			continue // empty document (only comments or whitespace)
		}
		doc++
		p.parseObject(j, hdr, location{file: p.path, doc: doc, line: c.line, item: -1}, "", "")
	}
}

type yamlChunk struct {
	line int // 1-based line in the file where the chunk starts
	data []byte
}

// splitYAML splits a YAML stream into documents at lines consisting of "---" (optionally followed
// by whitespace or a comment), as kubectl does.
func splitYAML(data []byte) []yamlChunk {
	var chunks []yamlChunk
	start, startLine, line := 0, 1, 1
	for off := 0; off < len(data); line++ {
		next := len(data)
		end := next
		if i := bytes.IndexByte(data[off:], '\n'); i >= 0 {
			end, next = off+i, off+i+1
		}
		if isSeparator(data[off:end]) {
			chunks = append(chunks, yamlChunk{line: startLine, data: data[start:off]})
			start, startLine = next, line+1
		}
		off = next
	}
	return append(chunks, yamlChunk{line: startLine, data: data[start:]})
}

func isSeparator(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("---"))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) == 0 || rest[0] == '#'
}

var yamlLineRE = regexp.MustCompile(`\bline (\d+)\b`)

// yamlError makes a YAML parser error refer to lines of the file rather than of the document and
// fits it on one line.
func yamlError(err error, startLine int) error {
	msg := yamlLineRE.ReplaceAllStringFunc(err.Error(), func(s string) string {
		n, convErr := strconv.Atoi(strings.TrimPrefix(s, "line "))
		if convErr != nil {
			return s
		}
		return "line " + strconv.Itoa(n+startLine-1)
	})
	lines := strings.Split(msg, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	msg = strings.Join(lines, " ")
	return errors.New("invalid YAML: " + msg)
}

// header is what parseObject reads of a document before it knows its type.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// parseObject handles one document or List item (as JSON). itemKind and itemAPIVersion are the
// kind and version implied by a typed list (PodList...) for items that carry no apiVersion and
// kind. read is the header of raw when the caller has it (it is decoded from raw otherwise).
func (p *parser) parseObject(raw []byte, read *header, loc location, itemKind, itemAPIVersion string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		p.errs = append(p.errs, loc.errorf("not an object: expected a mapping with apiVersion and kind"))
		return
	}
	var hdr header
	if read != nil {
		hdr = *read
	} else if err := sjson.UnmarshalCaseSensitivePreserveInts(raw, &hdr); err != nil {
		p.errs = append(p.errs, loc.err(p.decodeError(err)))
		return
	}
	if itemKind != "" && hdr.Kind == "" && hdr.APIVersion == "" {
		hdr.Kind, hdr.APIVersion = itemKind, itemAPIVersion
	}
	loc.kind, loc.name, loc.ns = hdr.Kind, hdr.Metadata.Name, hdr.Metadata.Namespace
	info, known := kinds[hdr.Kind]
	if known {
		if !info.namespaced {
			loc.ns = ""
		} else if loc.ns == "" {
			loc.ns = corev1.NamespaceDefault
		}
	}
	var missing bool
	if hdr.Kind == "" {
		p.errs = append(p.errs, loc.err(field.Required(field.NewPath("kind"), "")))
		missing = true
	}
	if hdr.APIVersion == "" {
		p.errs = append(p.errs, loc.err(field.Required(field.NewPath("apiVersion"), "")))
		missing = true
	}
	if missing {
		return
	}
	if itemKind != "" && hdr.Kind != itemKind {
		p.errs = append(p.errs, loc.err(field.Invalid(field.NewPath("kind"), hdr.Kind, "items of a "+itemKind+"List must be "+itemKind)))
		return
	}
	if lk, ok := listKinds[hdr.Kind]; ok {
		p.parseList(raw, hdr.APIVersion, lk.apiVersions, lk.itemKind, loc)
		return
	}
	if !known {
		args := []any{"file", p.path, "document", loc.doc, "kind", hdr.Kind, "apiVersion", hdr.APIVersion}
		if loc.item >= 0 {
			args = append(args, "item", loc.item)
		}
		p.logger.Info("skipping manifest of unsupported kind", args...)
		return
	}
	if !slices.Contains(info.apiVersions, hdr.APIVersion) {
		p.errs = append(p.errs, loc.err(field.NotSupported(field.NewPath("apiVersion"), hdr.APIVersion, info.apiVersions)))
		return
	}
	obj, decoded := decodeTyped(hdr.Kind, raw)
	var strict []error
	var err error
	if !decoded {
		obj, strict, err = info.decode(raw)
	}
	if err != nil {
		p.errs = append(p.errs, loc.err(p.decodeError(err)))
		return
	}
	slices.SortFunc(strict, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	for _, se := range strict {
		p.errs = append(p.errs, loc.strictErr(se))
	}
	fieldErrs := info.prepare(obj)
	loc.name, loc.ns = obj.GetName(), obj.GetNamespace()
	for _, fe := range fieldErrs {
		p.errs = append(p.errs, loc.err(fe))
	}
	if len(strict) > 0 || len(fieldErrs) > 0 {
		return
	}
	key := keyOf(info.id, info.namespaced, obj.GetNamespace(), obj.GetName())
	if prev, dup := p.seen[key]; dup {
		p.errs = append(p.errs, loc.errorf("duplicate %s: also defined in %s of this file", key, prev.loc(p.path).docRef()))
		return
	}
	o := &object{key: key, obj: info.strip(p.in, obj), doc: int32(loc.doc), line: int32(loc.line), item: int32(loc.item)}
	p.seen[key] = o
	p.objs = append(p.objs, o)
}

func (p *parser) parseList(raw []byte, apiVersion string, wantAPIVersions []string, itemKind string, loc location) {
	if loc.item >= 0 {
		p.errs = append(p.errs, loc.errorf("a %s may not be nested in a List", loc.kind))
		return
	}
	if !slices.Contains(wantAPIVersions, apiVersion) {
		p.errs = append(p.errs, loc.err(field.NotSupported(field.NewPath("apiVersion"), apiVersion, wantAPIVersions)))
		return
	}
	var list struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ListMeta   `json:"metadata"`
		Items      []json.RawMessage `json:"items"`
	}
	strict, err := sjson.UnmarshalStrict(raw, &list)
	if err != nil {
		p.errs = append(p.errs, loc.err(p.decodeError(err)))
		return
	}
	if len(strict) > 0 {
		slices.SortFunc(strict, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		for _, se := range strict {
			p.errs = append(p.errs, loc.strictErr(se))
		}
		return
	}
	for i, item := range list.Items {
		itemLoc := location{file: loc.file, doc: loc.doc, line: loc.line, item: i}
		// A typed list's items are of the list's version (v1alpha2 items in a v1alpha2 list).
		itemAPIVersion := ""
		if itemKind != "" {
			itemAPIVersion = apiVersion
		}
		p.parseObject(item, nil, itemLoc, itemKind, itemAPIVersion)
	}
}

// decodeError explains the classic YAML surprise: unquoted y, n, yes, no, on, off, true and false
// are booleans (as for kubectl), so `name: y` is not a string.
func (p *parser) decodeError(err error) error {
	msg := err.Error()
	if p.isYAML && strings.Contains(msg, "cannot unmarshal bool into") && strings.HasSuffix(msg, "of type string") {
		return fmt.Errorf("%w (YAML reads unquoted y, n, yes, no, on, off, true and false as booleans: quote the value)", err)
	}
	return err
}
