package manifests

import (
	"strconv"
	"unique"

	"k8s.io/apimachinery/pkg/util/intstr"
)

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
