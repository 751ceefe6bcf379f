package e2e

// Reading the upstream ClusterNetworkPolicy conformance suite (sigs.k8s.io/network-policy-api
// v0.3.0, package conformance) from the module's embedded files: the base manifests, each test's
// manifests, and the test sources, whose pokes are extracted from the syntax tree so that the
// hand translation in cnpconformance_cases_test.go can be held against them.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/netip"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance"
)

const (
	confNSPrefix = "network-policy-conformance-"
	// confPortBase is the first of the suite's host network ports (its default
	// HostNetworkPortRangeStart); the suite uses eight from there.
	confPortBase = 34345
)

// confHostNetworkPorts are the ports the templates of the suite's manifests see.
var confHostNetworkPorts = func() []int {
	var out []int
	for i := range 8 {
		out = append(out, confPortBase+i)
	}
	return out
}()

// confManifest returns an upstream manifest file after the suite's templating.
func confManifest(name string) ([]byte, error) {
	raw, err := conformance.Manifests.ReadFile(name)
	if err != nil {
		return nil, err
	}
	tmpl, err := template.New(name).Parse(string(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, struct{ HostNetworkPorts []int }{confHostNetworkPorts}); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return buf.Bytes(), nil
}

// decodeManifest decodes every document of a YAML stream, strictly (an unknown field is an
// error), calling add with its kind and JSON.
func decodeManifest(data []byte, add func(kind string, raw []byte) error) error {
	dec := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if len(doc) == 0 {
			continue
		}
		raw, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		kind, _ := doc["kind"].(string)
		if err := add(kind, raw); err != nil {
			return err
		}
	}
}

func strictUnmarshal(raw []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

// confPlacer places a pod of the suite's StatefulSets (replica i): its node and addresses.
type confPlacer func(ns, name string, replica int, hostNetwork bool) (node string, ips []netip.Addr, err error)

// confNode builds a Node as the kubelet reports it: the well-known labels, and its addresses.
func confNode(name string, podCIDRs []netip.Prefix, internal, external []netip.Addr) *corev1.Node {
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name}},
	}
	for _, p := range podCIDRs {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.String())
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	for _, ip := range internal {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	for _, ip := range external {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip.String()})
	}
	return n
}

// loadConfBase reads base/manifests.yaml into a cluster: its Namespaces, and the Pods its
// StatefulSets make (replicas <set>-<i>, labelled as the StatefulSet controller labels them,
// with the template's containers and their ports, host network or not), placed by place. The
// Nodes are the caller's.
func loadConfBase(place confPlacer, nodes []*corev1.Node) (*cnpCluster, error) {
	data, err := confManifest("base/manifests.yaml")
	if err != nil {
		return nil, err
	}
	c := newCNPCluster()
	for _, n := range nodes {
		c.Nodes[n.Name] = n
	}
	err = decodeManifest(data, func(kind string, raw []byte) error {
		switch kind {
		case "Namespace":
			ns := &corev1.Namespace{}
			if err := strictUnmarshal(raw, ns); err != nil {
				return err
			}
			c.Namespaces[ns.Name] = ns
		case "StatefulSet":
			ss := &appsv1.StatefulSet{}
			if err := strictUnmarshal(raw, ss); err != nil {
				return err
			}
			replicas := 1
			if ss.Spec.Replicas != nil {
				replicas = int(*ss.Spec.Replicas)
			}
			for i := range replicas {
				name := fmt.Sprintf("%s-%d", ss.Name, i)
				node, ips, err := place(ss.Namespace, name, i, ss.Spec.Template.Spec.HostNetwork)
				if err != nil {
					return err
				}
				lbl := map[string]string{}
				for k, v := range ss.Spec.Template.Labels {
					lbl[k] = v
				}
				lbl[appsv1.StatefulSetPodNameLabel] = name
				lbl[appsv1.PodIndexLabel] = strconv.Itoa(i)
				p := &corev1.Pod{
					TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
					ObjectMeta: metav1.ObjectMeta{Namespace: ss.Namespace, Name: name, Labels: lbl},
					Spec:       *ss.Spec.Template.Spec.DeepCopy(),
					Status:     corev1.PodStatus{Phase: corev1.PodRunning},
				}
				p.Spec.NodeName = node
				for j := range p.Spec.Containers {
					for k := range p.Spec.Containers[j].Ports {
						if p.Spec.Containers[j].Ports[k].Protocol == "" {
							p.Spec.Containers[j].Ports[k].Protocol = corev1.ProtocolTCP
						}
					}
				}
				for _, ip := range ips {
					p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
				}
				if len(ips) > 0 {
					p.Status.PodIP = ips[0].String()
				}
				c.Pods[ss.Namespace+"/"+name] = p
			}
		default:
			return fmt.Errorf("base/manifests.yaml: unexpected kind %q", kind)
		}
		return nil
	})
	return c, err
}

// loadConfPolicies reads the manifests of one upstream test: its ClusterNetworkPolicies and
// NetworkPolicies, and the templated text of its files.
func loadConfPolicies(names []string) ([]*npav1beta1.ClusterNetworkPolicy, []*networkingv1.NetworkPolicy, []byte, error) {
	var cnps []*npav1beta1.ClusterNetworkPolicy
	var nps []*networkingv1.NetworkPolicy
	var text bytes.Buffer
	for i, name := range names {
		data, err := confManifest(name)
		if err != nil {
			return nil, nil, nil, err
		}
		if i > 0 {
			text.WriteString("\n---\n")
		}
		text.Write(data)
		err = decodeManifest(data, func(kind string, raw []byte) error {
			switch kind {
			case "ClusterNetworkPolicy":
				cnp := &npav1beta1.ClusterNetworkPolicy{}
				if err := strictUnmarshal(raw, cnp); err != nil {
					return err
				}
				cnps = append(cnps, cnp)
			case "NetworkPolicy":
				np := &networkingv1.NetworkPolicy{}
				if err := strictUnmarshal(raw, np); err != nil {
					return err
				}
				nps = append(nps, np)
			default:
				return fmt.Errorf("unexpected kind %q", kind)
			}
			return nil
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return cnps, nps, text.Bytes(), nil
}

// upstreamPoke is one kubernetes.PokeServer call of an upstream test.
type upstreamPoke struct {
	From  string // "<namespace without the prefix>/<pod>"
	Proto string
	To    string
	Port  int
	Want  bool
}

func (p upstreamPoke) String() string {
	return fmt.Sprintf("%s -> %s %s/%d want %s", p.From, p.To, p.Proto, p.Port, verdict(p.Want))
}

type upstreamRun struct {
	Name  string
	Pokes []upstreamPoke
}

type upstreamTest struct {
	Name      string // ShortName
	Manifests []string
	Features  []string
	Runs      []upstreamRun
}

// parseUpstreamTests extracts every ConformanceTest of the upstream test sources, in the order
// the suite runs them (ConformanceTests as the packages' init functions append to it, files in
// name order), with the PokeServer calls of each t.Run.
func parseUpstreamTests() ([]upstreamTest, error) {
	files, err := fs.Glob(conformance.Manifests, "tests/*.go")
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	fset := token.NewFileSet()
	defs := map[string]*ast.CompositeLit{}
	var order []string
	for _, name := range files {
		src, err := conformance.Manifests.ReadFile(name)
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, path.Base(name), src, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					vs, ok := s.(*ast.ValueSpec)
					if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
						continue
					}
					if cl, ok := vs.Values[0].(*ast.CompositeLit); ok && exprString(cl.Type) == "suite.ConformanceTest" {
						defs[vs.Names[0].Name] = cl
					}
				}
			case *ast.FuncDecl:
				if d.Name.Name != "init" {
					continue
				}
				ast.Inspect(d.Body, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok || exprString(call.Fun) != "append" {
						return true
					}
					for _, a := range call.Args[1:] {
						order = append(order, exprString(a))
					}
					return false
				})
			}
		}
	}
	var out []upstreamTest
	for _, ident := range order {
		cl, ok := defs[ident]
		if !ok {
			return nil, fmt.Errorf("ConformanceTests appends %s, which is not defined", ident)
		}
		ut, err := parseUpstreamTest(cl)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ident, err)
		}
		out = append(out, ut)
	}
	return out, nil
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}

func stringLit(e ast.Expr) (string, error) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", fmt.Errorf("not a string literal: %s", exprString(e))
	}
	return strconv.Unquote(bl.Value)
}

func parseUpstreamTest(cl *ast.CompositeLit) (upstreamTest, error) {
	var ut upstreamTest
	var body *ast.BlockStmt
	for _, elt := range cl.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		switch exprString(kv.Key) {
		case "ShortName":
			s, err := stringLit(kv.Value)
			if err != nil {
				return ut, err
			}
			ut.Name = s
		case "Manifests":
			for _, m := range kv.Value.(*ast.CompositeLit).Elts {
				s, err := stringLit(m)
				if err != nil {
					return ut, err
				}
				ut.Manifests = append(ut.Manifests, s)
			}
		case "Features":
			for _, f := range kv.Value.(*ast.CompositeLit).Elts {
				ut.Features = append(ut.Features, strings.TrimPrefix(exprString(f), "suite."))
			}
		case "Test":
			body = kv.Value.(*ast.FuncLit).Body
		}
	}
	if body == nil {
		return ut, errors.New("no Test function")
	}
	// Walk the test in source order (it is straight-line code): GetPod assignments say which
	// pod a variable holds when a PokeServer call reads its .Status.PodIP; t.Run calls open runs.
	vars := map[string]string{}
	var err error
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		if err != nil {
			return false
		}
		switch n := n.(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) == 1 && len(n.Rhs) == 1 {
				if call, ok := n.Rhs[0].(*ast.CallExpr); ok && exprString(call.Fun) == "kubernetes.GetPod" {
					ns, e1 := stringLit(call.Args[2])
					pod, e2 := stringLit(call.Args[3])
					if err = errors.Join(e1, e2); err != nil {
						return false
					}
					vars[exprString(n.Lhs[0])] = strings.TrimPrefix(ns, confNSPrefix) + "/" + pod
				}
			}
		case *ast.CallExpr:
			switch exprString(n.Fun) {
			case "t.Run":
				name, e := stringLit(n.Args[0])
				if err = e; err != nil {
					return false
				}
				ut.Runs = append(ut.Runs, upstreamRun{Name: name})
				ast.Inspect(n.Args[1], visit)
				return false
			case "kubernetes.PokeServer":
				var p upstreamPoke
				p, err = parsePoke(n, vars)
				if err != nil {
					return false
				}
				if len(ut.Runs) == 0 {
					err = fmt.Errorf("PokeServer outside t.Run")
					return false
				}
				r := &ut.Runs[len(ut.Runs)-1]
				r.Pokes = append(r.Pokes, p)
			}
		}
		return true
	}
	ast.Inspect(body, visit)
	return ut, err
}

// parsePoke reads PokeServer(t, client, kubeConfig, clientNamespace, clientPod, protocol,
// targetHost, targetPort, timeoutConfig, shouldConnect).
func parsePoke(call *ast.CallExpr, vars map[string]string) (upstreamPoke, error) {
	var p upstreamPoke
	if len(call.Args) != 10 {
		return p, fmt.Errorf("PokeServer with %d arguments", len(call.Args))
	}
	ns, e1 := stringLit(call.Args[3])
	pod, e2 := stringLit(call.Args[4])
	proto, e3 := stringLit(call.Args[5])
	if err := errors.Join(e1, e2, e3); err != nil {
		return p, err
	}
	p.From, p.Proto = strings.TrimPrefix(ns, confNSPrefix)+"/"+pod, proto
	host := exprString(call.Args[6])
	v, ok := strings.CutSuffix(host, ".Status.PodIP")
	if !ok || vars[v] == "" {
		return p, fmt.Errorf("PokeServer target %s: not a pod's IP", host)
	}
	p.To = vars[v]
	conv, ok := call.Args[7].(*ast.CallExpr)
	if !ok || exprString(conv.Fun) != "int32" {
		return p, fmt.Errorf("PokeServer port: not int32(...)")
	}
	switch a := conv.Args[0].(type) {
	case *ast.BasicLit:
		n, err := strconv.Atoi(a.Value)
		if err != nil {
			return p, err
		}
		p.Port = n
	case *ast.IndexExpr:
		if exprString(a.X) != "s.HostNetworkPorts" {
			return p, fmt.Errorf("PokeServer port: index of %s", exprString(a.X))
		}
		i, err := strconv.Atoi(a.Index.(*ast.BasicLit).Value)
		if err != nil {
			return p, err
		}
		p.Port = confHostNetworkPorts[i]
	default:
		return p, fmt.Errorf("PokeServer port: %T", a)
	}
	switch exprString(call.Args[9]) {
	case "true":
		p.Want = true
	case "false":
	default:
		return p, fmt.Errorf("PokeServer shouldConnect: %s", exprString(call.Args[9]))
	}
	return p, nil
}
