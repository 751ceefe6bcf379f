package manifests

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// decodeNamespace returns the decoded object and true, or false when the strict decode must
// read raw; so do decodePod and decodePolicy for their kinds.
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
