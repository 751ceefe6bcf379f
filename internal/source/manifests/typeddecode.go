package manifests

import (
	"strconv"
	"unique"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// typedDecoder decodes the JSON of a Namespace, Pod or NetworkPolicy straight into its Go type,
// for the fields that manifests of those kinds nearly always consist of. The strict decode of
// sigs.k8s.io/json finds each field by reflection and keeps a path for every value in case it
// has to report it; on a cold start of thousands of files that is the largest part of the CPU
// the load spends, and most of what it allocates.
//
// What it accepts it decodes to exactly the object the strict decode returns (the same values,
// the same nil and empty slices, maps and pointers). It gives up on everything else: a field it
// does not know (whether or not the type has it), a value of another JSON type, null (except
// metadata.creationTimestamp), escapes and non-ASCII bytes in strings, numbers other than
// plain integers in range, a duplicate key, malformed JSON. The caller then runs the strict
// decode, which also words the errors, so what is reported about a document never depends on
// which decoder read it.
//
// Label keys and values are interned (unique.Make): the same few strings are repeated in
// thousands of objects, which the agent keeps in memory as long as they are in effect.
type typedDecoder struct {
	b   []byte
	pos int
	ok  bool
}

// decodeNamespace, decodePod and decodePolicy return the decoded object and true, or false
// when the strict decode must read raw.
func decodeNamespace(raw []byte) (*corev1.Namespace, bool) {
	d := typedDecoder{b: raw, ok: true}
	o := new(corev1.Namespace)
	d.object(func(key []byte) {
		if d.typeAndMeta(key, &o.TypeMeta, &o.ObjectMeta) {
			return
		}
		switch string(key) {
		case "spec":
			d.object(func(key []byte) {
				switch string(key) {
				case "finalizers":
					d.array(func() {
						var f string
						d.str(&f)
						o.Spec.Finalizers = append(o.Spec.Finalizers, corev1.FinalizerName(f))
					}, func() { o.Spec.Finalizers = []corev1.FinalizerName{} })
				default:
					d.ok = false
				}
			})
		case "status":
			d.object(func(key []byte) {
				switch string(key) {
				case "phase":
					d.internedAs(func(s string) { o.Status.Phase = corev1.NamespacePhase(s) })
				default:
					d.ok = false
				}
			})
		default:
			d.ok = false
		}
	})
	return o, d.end()
}

func decodePod(raw []byte) (*corev1.Pod, bool) {
	d := typedDecoder{b: raw, ok: true}
	o := new(corev1.Pod)
	d.object(func(key []byte) {
		if d.typeAndMeta(key, &o.TypeMeta, &o.ObjectMeta) {
			return
		}
		switch string(key) {
		case "spec":
			d.podSpec(&o.Spec)
		case "status":
			d.podStatus(&o.Status)
		default:
			d.ok = false
		}
	})
	return o, d.end()
}

func decodePolicy(raw []byte) (*networkingv1.NetworkPolicy, bool) {
	d := typedDecoder{b: raw, ok: true}
	o := new(networkingv1.NetworkPolicy)
	d.object(func(key []byte) {
		if d.typeAndMeta(key, &o.TypeMeta, &o.ObjectMeta) {
			return
		}
		switch string(key) {
		case "spec":
			d.policySpec(&o.Spec)
		default:
			d.ok = false
		}
	})
	return o, d.end()
}

// end reports whether the whole input was decoded.
func (d *typedDecoder) end() bool {
	d.space()
	return d.ok && d.pos == len(d.b)
}

// typeAndMeta reads the value of key when it is a field every kind has, and reports whether it was.
func (d *typedDecoder) typeAndMeta(key []byte, tm *metav1.TypeMeta, m *metav1.ObjectMeta) bool {
	switch string(key) {
	case "apiVersion":
		d.str(&tm.APIVersion)
	case "kind":
		d.str(&tm.Kind)
	case "metadata":
		d.meta(m)
	default:
		return false
	}
	return true
}

func (d *typedDecoder) meta(m *metav1.ObjectMeta) {
	d.object(func(key []byte) {
		switch string(key) {
		case "name":
			d.str(&m.Name)
		case "namespace":
			d.internedAs(func(s string) { m.Namespace = s })
		case "generateName":
			d.str(&m.GenerateName)
		case "uid":
			var s string
			d.str(&s)
			m.UID = types.UID(s)
		case "resourceVersion":
			d.str(&m.ResourceVersion)
		case "generation":
			m.Generation = d.integer(64)
		case "labels":
			d.stringMap(&m.Labels)
		case "annotations":
			d.stringMap(&m.Annotations)
		case "creationTimestamp":
			// kubectl writes "creationTimestamp: null" into what it generates; a timestamp
			// itself is left to the strict decode.
			if !d.literal("null") {
				d.ok = false
			}
		default:
			d.ok = false
		}
	})
}

func (d *typedDecoder) policySpec(s *networkingv1.NetworkPolicySpec) {
	d.object(func(key []byte) {
		switch string(key) {
		case "podSelector":
			d.selector(&s.PodSelector)
		case "policyTypes":
			d.array(func() {
				d.internedAs(func(v string) { s.PolicyTypes = append(s.PolicyTypes, networkingv1.PolicyType(v)) })
			}, func() { s.PolicyTypes = []networkingv1.PolicyType{} })
		case "ingress":
			d.array(func() {
				var r networkingv1.NetworkPolicyIngressRule
				d.object(func(key []byte) {
					switch string(key) {
					case "ports":
						d.policyPorts(&r.Ports)
					case "from":
						d.policyPeers(&r.From)
					default:
						d.ok = false
					}
				})
				s.Ingress = append(s.Ingress, r)
			}, func() { s.Ingress = []networkingv1.NetworkPolicyIngressRule{} })
		case "egress":
			d.array(func() {
				var r networkingv1.NetworkPolicyEgressRule
				d.object(func(key []byte) {
					switch string(key) {
					case "ports":
						d.policyPorts(&r.Ports)
					case "to":
						d.policyPeers(&r.To)
					default:
						d.ok = false
					}
				})
				s.Egress = append(s.Egress, r)
			}, func() { s.Egress = []networkingv1.NetworkPolicyEgressRule{} })
		default:
			d.ok = false
		}
	})
}

func (d *typedDecoder) policyPorts(ports *[]networkingv1.NetworkPolicyPort) {
	d.array(func() {
		var p networkingv1.NetworkPolicyPort
		d.object(func(key []byte) {
			switch string(key) {
			case "protocol":
				d.internedAs(func(s string) {
					proto := corev1.Protocol(s)
					p.Protocol = &proto
				})
			case "port":
				p.Port = d.intOrString()
			case "endPort":
				v := int32(d.integer(32))
				p.EndPort = &v
			default:
				d.ok = false
			}
		})
		*ports = append(*ports, p)
	}, func() { *ports = []networkingv1.NetworkPolicyPort{} })
}

func (d *typedDecoder) policyPeers(peers *[]networkingv1.NetworkPolicyPeer) {
	d.array(func() {
		var p networkingv1.NetworkPolicyPeer
		d.object(func(key []byte) {
			switch string(key) {
			case "podSelector":
				p.PodSelector = new(metav1.LabelSelector)
				d.selector(p.PodSelector)
			case "namespaceSelector":
				p.NamespaceSelector = new(metav1.LabelSelector)
				d.selector(p.NamespaceSelector)
			case "ipBlock":
				p.IPBlock = new(networkingv1.IPBlock)
				d.object(func(key []byte) {
					switch string(key) {
					case "cidr":
						d.str(&p.IPBlock.CIDR)
					case "except":
						d.stringArray(&p.IPBlock.Except)
					default:
						d.ok = false
					}
				})
			default:
				d.ok = false
			}
		})
		*peers = append(*peers, p)
	}, func() { *peers = []networkingv1.NetworkPolicyPeer{} })
}

func (d *typedDecoder) selector(s *metav1.LabelSelector) {
	d.object(func(key []byte) {
		switch string(key) {
		case "matchLabels":
			d.stringMap(&s.MatchLabels)
		case "matchExpressions":
			d.array(func() {
				var r metav1.LabelSelectorRequirement
				d.object(func(key []byte) {
					switch string(key) {
					case "key":
						d.internedAs(func(v string) { r.Key = v })
					case "operator":
						d.internedAs(func(v string) { r.Operator = metav1.LabelSelectorOperator(v) })
					case "values":
						d.array(func() {
							d.internedAs(func(v string) { r.Values = append(r.Values, v) })
						}, func() { r.Values = []string{} })
					default:
						d.ok = false
					}
				})
				s.MatchExpressions = append(s.MatchExpressions, r)
			}, func() { s.MatchExpressions = []metav1.LabelSelectorRequirement{} })
		default:
			d.ok = false
		}
	})
}

func (d *typedDecoder) podSpec(s *corev1.PodSpec) {
	d.object(func(key []byte) {
		switch string(key) {
		case "containers":
			d.containers(&s.Containers)
		case "initContainers":
			d.containers(&s.InitContainers)
		case "nodeName":
			d.internedAs(func(v string) { s.NodeName = v })
		case "hostNetwork":
			s.HostNetwork = d.boolean()
		case "restartPolicy":
			d.internedAs(func(v string) { s.RestartPolicy = corev1.RestartPolicy(v) })
		case "dnsPolicy":
			d.internedAs(func(v string) { s.DNSPolicy = corev1.DNSPolicy(v) })
		case "schedulerName":
			d.internedAs(func(v string) { s.SchedulerName = v })
		case "serviceAccountName":
			d.internedAs(func(v string) { s.ServiceAccountName = v })
		case "terminationGracePeriodSeconds":
			v := d.integer(64)
			s.TerminationGracePeriodSeconds = &v
		default:
			d.ok = false
		}
	})
}

func (d *typedDecoder) containers(cs *[]corev1.Container) {
	d.array(func() {
		var c corev1.Container
		d.object(func(key []byte) {
			switch string(key) {
			case "name":
				d.internedAs(func(v string) { c.Name = v })
			case "image":
				d.internedAs(func(v string) { c.Image = v })
			case "imagePullPolicy":
				d.internedAs(func(v string) { c.ImagePullPolicy = corev1.PullPolicy(v) })
			case "command":
				d.stringArray(&c.Command)
			case "args":
				d.stringArray(&c.Args)
			case "workingDir":
				d.str(&c.WorkingDir)
			case "terminationMessagePath":
				d.internedAs(func(v string) { c.TerminationMessagePath = v })
			case "terminationMessagePolicy":
				d.internedAs(func(v string) { c.TerminationMessagePolicy = corev1.TerminationMessagePolicy(v) })
			case "resources":
				// Requests and limits are quantities, left to the strict decode.
				d.object(func([]byte) { d.ok = false })
			case "ports":
				d.array(func() {
					var p corev1.ContainerPort
					d.object(func(key []byte) {
						switch string(key) {
						case "name":
							d.internedAs(func(v string) { p.Name = v })
						case "containerPort":
							p.ContainerPort = int32(d.integer(32))
						case "hostPort":
							p.HostPort = int32(d.integer(32))
						case "protocol":
							d.internedAs(func(v string) { p.Protocol = corev1.Protocol(v) })
						case "hostIP":
							d.str(&p.HostIP)
						default:
							d.ok = false
						}
					})
					c.Ports = append(c.Ports, p)
				}, func() { c.Ports = []corev1.ContainerPort{} })
			default:
				d.ok = false
			}
		})
		*cs = append(*cs, c)
	}, func() { *cs = []corev1.Container{} })
}

func (d *typedDecoder) podStatus(s *corev1.PodStatus) {
	d.object(func(key []byte) {
		switch string(key) {
		case "phase":
			d.internedAs(func(v string) { s.Phase = corev1.PodPhase(v) })
		case "podIP":
			d.str(&s.PodIP)
		case "hostIP":
			d.internedAs(func(v string) { s.HostIP = v })
		case "podIPs":
			d.array(func() {
				var ip corev1.PodIP
				d.object(func(key []byte) {
					if string(key) != "ip" {
						d.ok = false
						return
					}
					d.str(&ip.IP)
				})
				s.PodIPs = append(s.PodIPs, ip)
			}, func() { s.PodIPs = []corev1.PodIP{} })
		case "hostIPs":
			d.array(func() {
				var ip corev1.HostIP
				d.object(func(key []byte) {
					if string(key) != "ip" {
						d.ok = false
						return
					}
					d.internedAs(func(v string) { ip.IP = v })
				})
				s.HostIPs = append(s.HostIPs, ip)
			}, func() { s.HostIPs = []corev1.HostIP{} })
		default:
			d.ok = false
		}
	})
}

// The JSON readers below set d.ok to false and return zero values on anything outside what is
// decoded here; callers carry on and the result is thrown away.

func (d *typedDecoder) space() {
	for d.pos < len(d.b) {
		switch d.b[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// next skips white space and consumes c if it is the next byte.
func (d *typedDecoder) next(c byte) bool {
	d.space()
	if d.pos < len(d.b) && d.b[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

// object reads an object, calling field for each key with the reader at its value; field must
// read the value. A key that appears twice makes the strict decode report it, so it gives up.
func (d *typedDecoder) object(field func(key []byte)) {
	if !d.ok || !d.next('{') {
		d.ok = false
		return
	}
	if d.next('}') {
		return
	}
	var seen [16][]byte // a handful of keys per object: a scan is cheaper than a map
	n := 0
	for d.ok {
		key := d.rawString()
		if !d.ok || !d.next(':') {
			d.ok = false
			return
		}
		if n == len(seen) {
			d.ok = false // more keys than any object decoded here has
			return
		}
		for _, k := range seen[:n] {
			if string(key) == string(k) {
				d.ok = false
				return
			}
		}
		seen[n] = key
		n++
		field(key)
		if !d.ok {
			return
		}
		if d.next(',') {
			continue
		}
		if d.next('}') {
			return
		}
		d.ok = false
	}
}

// array reads an array, calling elem at each element; empty is called for an array with none
// (the strict decode sets an empty, non-nil slice then).
func (d *typedDecoder) array(elem func(), empty func()) {
	if !d.ok || !d.next('[') {
		d.ok = false
		return
	}
	if d.next(']') {
		empty()
		return
	}
	for d.ok {
		elem()
		if !d.ok {
			return
		}
		if d.next(',') {
			continue
		}
		if d.next(']') {
			return
		}
		d.ok = false
	}
}

// rawString reads a string with no escapes and only printable ASCII, and returns its bytes
// inside the input.
func (d *typedDecoder) rawString() []byte {
	if !d.ok || !d.next('"') {
		d.ok = false
		return nil
	}
	start := d.pos
	for d.pos < len(d.b) {
		c := d.b[d.pos]
		switch {
		case c == '"':
			d.pos++
			return d.b[start : d.pos-1]
		case c == '\\' || c < 0x20 || c >= 0x80:
			d.ok = false
			return nil
		}
		d.pos++
	}
	d.ok = false
	return nil
}

func (d *typedDecoder) str(dst *string) {
	if s := d.rawString(); d.ok {
		*dst = string(s)
	}
}

// internedAs reads a string and passes its canonical copy to set.
func (d *typedDecoder) internedAs(set func(string)) {
	if s := d.rawString(); d.ok {
		set(intern(s))
	}
}

func intern(b []byte) string { return unique.Make(string(b)).Value() }

func (d *typedDecoder) stringArray(dst *[]string) {
	d.array(func() {
		var s string
		d.str(&s)
		*dst = append(*dst, s)
	}, func() { *dst = []string{} })
}

// stringMap reads an object of strings into a new map, as the strict decode does for a nil map.
func (d *typedDecoder) stringMap(dst *map[string]string) {
	if !d.ok || !d.next('{') {
		d.ok = false
		return
	}
	m := map[string]string{}
	*dst = m
	if d.next('}') {
		return
	}
	for d.ok {
		k := d.rawString()
		if !d.ok || !d.next(':') {
			d.ok = false
			return
		}
		if _, dup := m[string(k)]; dup {
			d.ok = false
			return
		}
		v := d.rawString()
		if !d.ok {
			return
		}
		m[intern(k)] = intern(v)
		if d.next(',') {
			continue
		}
		if d.next('}') {
			return
		}
		d.ok = false
	}
}

func (d *typedDecoder) literal(lit string) bool {
	d.space()
	if d.ok && len(d.b)-d.pos >= len(lit) && string(d.b[d.pos:d.pos+len(lit)]) == lit {
		d.pos += len(lit)
		return true
	}
	return false
}

func (d *typedDecoder) boolean() bool {
	switch {
	case d.literal("true"):
		return true
	case d.literal("false"):
		return false
	}
	d.ok = false
	return false
}

// integer reads an integer that fits in bits, written as JSON writes one: no plus sign, no
// leading zeros, no fraction or exponent.
func (d *typedDecoder) integer(bits int) int64 {
	d.space()
	start := d.pos
	if d.pos < len(d.b) && d.b[d.pos] == '-' {
		d.pos++
	}
	digits := d.pos
	for d.pos < len(d.b) && d.b[d.pos] >= '0' && d.b[d.pos] <= '9' {
		d.pos++
	}
	n := d.pos - digits
	if !d.ok || n == 0 || d.b[digits] == '0' && (n > 1 || digits > start) {
		d.ok = false
		return 0
	}
	if d.pos < len(d.b) {
		switch d.b[d.pos] {
		case '.', 'e', 'E':
			d.ok = false
			return 0
		}
	}
	v, err := strconv.ParseInt(string(d.b[start:d.pos]), 10, bits)
	if err != nil {
		d.ok = false
		return 0
	}
	return v
}

// intOrString reads what intstr.IntOrString's UnmarshalJSON takes: a string, or an int32.
func (d *typedDecoder) intOrString() *intstr.IntOrString {
	d.space()
	if d.pos < len(d.b) && d.b[d.pos] == '"' {
		s := d.rawString()
		if !d.ok {
			return nil
		}
		return &intstr.IntOrString{Type: intstr.String, StrVal: intern(s)}
	}
	v := d.integer(32)
	if !d.ok {
		return nil
	}
	return &intstr.IntOrString{Type: intstr.Int, IntVal: int32(v)}
}
