package manifests

import (
	"bytes"
	"regexp"
	"slices"
	"strconv"
	"sync"
)

// fastYAML converts YAML documents of the plain block style that manifests are nearly always
// written in (what kubectl, yaml.Marshal and most people write: block mappings and sequences,
// one-line scalars, comments) to JSON. sigs.k8s.io/yaml builds a tree of interface values through
// yaml.v2 and marshals it, which is most of the cost of a cold start on thousands of files; this
// makes one pass over the lines instead.
//
// What it accepts it converts to exactly the bytes yaml.YAMLToJSONStrict returns (keys sorted,
// the same escapes, YAML 1.1 booleans and nulls resolved as yaml.v2 does), so the objects, and the
// errors found in them, are the same whichever converted a document. It gives up on anything else
// (flow collections other than {} and [], block and multi-line scalars, escapes, anchors, tags,
// duplicate keys, tabs, non-ASCII bytes, numbers other than plain decimal integers...) and on
// anything malformed, and the caller converts those documents with sigs.k8s.io/yaml, which also
// words the errors.
type fastYAML struct {
	lines   []yamlLine
	pos     int
	depth   int
	out     []byte
	entries []mapEntry // of the mappings being converted, innermost last
	tmp     []byte

	// What the header decode of parseObject would find (apiVersion, kind, metadata.name and
	// metadata.namespace), recorded on the way when those are strings or absent, so that the
	// document is decoded once rather than twice.
	hdr    header
	hdrOK  bool
	level  int  // of the mapping being converted: 1 for the document
	inMeta bool // converting the value of the document's metadata
}

// yamlLine is a line with content: not blank and not a comment.
type yamlLine struct {
	indent int
	text   []byte // without the indentation and trailing spaces
}

// mapEntry is one key of a mapping and where its "key":value is in out.
type mapEntry struct {
	key        []byte
	start, end int
}

// maxYAMLDepth bounds the nesting the fast path follows (the slow path has its own limits).
const maxYAMLDepth = 64

var fastYAMLPool = sync.Pool{New: func() any { return new(fastYAML) }}

// convert returns the JSON of doc, and false if doc is not in the subset converted here. The
// result is valid until the next call. hdr is the document's header when the header decode
// needs not run (nil otherwise).
func (c *fastYAML) convert(doc []byte) (out []byte, hdr *header, ok bool) {
	out, ok = c.convertDoc(doc)
	if ok && c.hdrOK {
		hdr = &c.hdr
	}
	return out, hdr, ok
}

func (c *fastYAML) convertDoc(doc []byte) ([]byte, bool) {
	c.lines, c.pos, c.depth, c.out, c.entries = c.lines[:0], 0, 0, c.out[:0], c.entries[:0]
	c.hdr, c.hdrOK, c.level, c.inMeta = header{}, true, 0, false
	if !c.split(doc) {
		return nil, false
	}
	if len(c.lines) == 0 {
		return append(c.out, "null"...), true
	}
	// A document is a mapping (anything else is not a manifest: the slow path says so).
	if l := c.lines[0]; isEntry(l.text) || !isKeyLine(l.text) {
		return nil, false
	}
	if !c.node(-1) || c.pos != len(c.lines) {
		return nil, false
	}
	return c.out, true
}

// split fills c.lines, and reports false for bytes or lines outside the subset.
func (c *fastYAML) split(doc []byte) bool {
	for len(doc) > 0 {
		var line []byte
		if i := bytes.IndexByte(doc, '\n'); i >= 0 {
			line, doc = doc[:i], doc[i+1:]
		} else {
			line, doc = doc, nil
		}
		indent := 0
		for indent < len(line) && line[indent] == ' ' {
			indent++
		}
		for _, b := range line[indent:] {
			// Tabs, other control characters and non-ASCII bytes (YAML 1.1 reads some of these
			// as line breaks) are left to the slow path.
			if b < 0x20 || b >= 0x7f {
				return false
			}
		}
		text := bytes.TrimRight(line[indent:], " ")
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		// Directives, document markers and reserved indicators.
		if text[0] == '%' || bytes.HasPrefix(text, []byte("---")) || bytes.HasPrefix(text, []byte("...")) {
			return false
		}
		c.lines = append(c.lines, yamlLine{indent: indent, text: text})
	}
	return true
}

// isEntry reports whether text starts a block sequence entry.
func isEntry(text []byte) bool {
	return text[0] == '-' && (len(text) == 1 || text[1] == ' ')
}

// node converts the node starting at the current line, which is more indented than parent.
func (c *fastYAML) node(parent int) bool {
	if c.depth++; c.depth > maxYAMLDepth {
		return false
	}
	defer func() { c.depth-- }()
	l := c.lines[c.pos]
	switch {
	case isEntry(l.text):
		return c.sequence(l.indent)
	case isKeyLine(l.text):
		return c.mapping(l.indent)
	}
	if !c.scalar(l.text) {
		return false
	}
	c.pos++
	// A more indented line would continue a plain scalar (or be an error).
	return c.pos == len(c.lines) || c.lines[c.pos].indent <= parent
}

// isKeyLine reports whether text starts with a key of the subset followed by ":".
func isKeyLine(text []byte) bool {
	_, _, ok := splitKey(text)
	return ok
}

// splitKey splits "key: value" (or "key:"). The key is a plain scalar of letters, digits and
// ._/- that yaml.v2 reads as a string; rest is the value, empty when there is none on the line.
func splitKey(text []byte) (key, rest []byte, ok bool) {
	i := 0
	for i < len(text) && keyChar(text[i]) {
		i++
	}
	if i == 0 || i == len(text) || text[i] != ':' || (i+1 < len(text) && text[i+1] != ' ') {
		return nil, nil, false
	}
	key = text[:i]
	if plainKindOf(key) != plainString {
		return nil, nil, false
	}
	rest = bytes.TrimLeft(text[i+1:], " ")
	if len(rest) > 0 && rest[0] == '#' {
		rest = nil
	}
	return key, rest, true
}

func keyChar(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '/' || b == '-'
}

// mapping converts the block mapping whose keys are at indent n, with its keys sorted as
// encoding/json sorts a map's.
func (c *fastYAML) mapping(n int) bool {
	base := len(c.entries)
	c.level++
	defer func() { c.entries, c.level = c.entries[:base], c.level-1 }()
	var field *string // the header field of the key being converted, if any
	meta := false     // the key being converted is the document's metadata
	open := len(c.out)
	c.out = append(c.out, '{')
	sorted := true
	for c.pos < len(c.lines) {
		l := c.lines[c.pos]
		if l.indent < n {
			break
		}
		if l.indent > n {
			return false
		}
		key, rest, ok := splitKey(l.text)
		if !ok {
			return false
		}
		if len(c.entries) > base {
			c.out = append(c.out, ',')
			if bytes.Compare(c.entries[len(c.entries)-1].key, key) >= 0 {
				sorted = false
			}
		}
		start := len(c.out)
		c.out = append(c.out, '"')
		c.out = append(c.out, key...)
		c.out = append(c.out, '"', ':')
		c.pos++
		field, meta = c.headerField(key)
		if meta {
			c.inMeta = true
		}
		value := len(c.out)
		switch {
		case len(rest) > 0:
			if !c.scalar(rest) {
				return false
			}
			if c.pos < len(c.lines) && c.lines[c.pos].indent > n {
				return false // a continuation of a plain scalar, or an error
			}
		case c.pos < len(c.lines) && c.lines[c.pos].indent > n:
			if !c.node(n) {
				return false
			}
		case c.pos < len(c.lines) && c.lines[c.pos].indent == n && isEntry(c.lines[c.pos].text):
			// A sequence may be at the indentation of its key.
			if !c.sequence(n) {
				return false
			}
		default:
			c.out = append(c.out, "null"...)
		}
		if meta {
			c.inMeta = false
			if v := c.out[value]; v != '{' && v != 'n' {
				c.hdrOK = false // metadata is not a mapping: the header decode fails
			}
		}
		if field != nil {
			c.recordHeader(field, c.out[value:])
		}
		c.entries = append(c.entries, mapEntry{key: key, start: start, end: len(c.out)})
	}
	if !sorted && !c.sortEntries(open+1, c.entries[base:]) {
		return false
	}
	c.out = append(c.out, '}')
	return true
}

// headerField says which header field a key of the mapping being converted is.
func (c *fastYAML) headerField(key []byte) (field *string, meta bool) {
	switch {
	case c.level == 1 && string(key) == "apiVersion":
		return &c.hdr.APIVersion, false
	case c.level == 1 && string(key) == "kind":
		return &c.hdr.Kind, false
	case c.level == 1 && string(key) == "metadata":
		return nil, true
	case c.level == 2 && c.inMeta && string(key) == "name":
		return &c.hdr.Metadata.Name, false
	case c.level == 2 && c.inMeta && string(key) == "namespace":
		return &c.hdr.Metadata.Namespace, false
	}
	return nil, false
}

// recordHeader records the JSON value v of a header field as the header decode would: a string
// without escapes as it is, null as nothing; any other value fails the decode, which is left to
// do the work (and word the error).
func (c *fastYAML) recordHeader(field *string, v []byte) {
	switch {
	case len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0:
		*field = string(v[1 : len(v)-1])
	case string(v) == "null":
	default:
		c.hdrOK = false
	}
}

// sortEntries rewrites out[from:] (the entries, with commas) in the order of their keys, and
// reports false for a duplicate key (an error for yaml.UnmarshalStrict).
func (c *fastYAML) sortEntries(from int, entries []mapEntry) bool {
	c.tmp = append(c.tmp[:0], c.out[from:]...)
	for i := range entries {
		entries[i].start -= from
		entries[i].end -= from
	}
	slices.SortFunc(entries, func(a, b mapEntry) int { return bytes.Compare(a.key, b.key) })
	c.out = c.out[:from]
	for i, e := range entries {
		if i > 0 {
			if bytes.Equal(entries[i-1].key, e.key) {
				return false
			}
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.tmp[e.start:e.end]...)
	}
	return true
}

// sequence converts the block sequence whose entries are at indent n.
func (c *fastYAML) sequence(n int) bool {
	c.out = append(c.out, '[')
	first := true
	for c.pos < len(c.lines) {
		l := c.lines[c.pos]
		if l.indent < n {
			break
		}
		if l.indent > n {
			return false
		}
		if !isEntry(l.text) {
			break // the next key of the mapping that holds the sequence
		}
		if !first {
			c.out = append(c.out, ',')
		}
		first = false
		rest := bytes.TrimLeft(l.text[1:], " ")
		if len(rest) == 0 || rest[0] == '#' {
			c.pos++
			if c.pos < len(c.lines) && c.lines[c.pos].indent > n {
				if !c.node(n) {
					return false
				}
			} else {
				c.out = append(c.out, "null"...)
			}
			continue
		}
		// The entry's content is a node at the column where it starts.
		c.lines[c.pos] = yamlLine{indent: n + len(l.text) - len(rest), text: rest}
		if !c.node(n) {
			return false
		}
	}
	c.out = append(c.out, ']')
	return true
}

// scalar converts the value text of one line (with a possible trailing comment).
func (c *fastYAML) scalar(v []byte) bool {
	switch v[0] {
	case '"':
		end := bytes.IndexByte(v[1:], '"') + 1
		if end == 0 || bytes.IndexByte(v[1:end], '\\') >= 0 || !onlyComment(v[end+1:]) {
			return false
		}
		c.appendString(v[1:end])
		return true
	case '\'':
		c.tmp = c.tmp[:0]
		for i := 1; i < len(v); i++ {
			if v[i] != '\'' {
				c.tmp = append(c.tmp, v[i])
				continue
			}
			if i+1 < len(v) && v[i+1] == '\'' {
				c.tmp = append(c.tmp, '\'')
				i++
				continue
			}
			if !onlyComment(v[i+1:]) {
				return false
			}
			c.appendString(c.tmp)
			return true
		}
		return false
	case '{', '[':
		if !bytes.HasPrefix(v, []byte("{}")) && !bytes.HasPrefix(v, []byte("[]")) || !onlyComment(v[2:]) {
			return false
		}
		c.out = append(c.out, v[0], v[1])
		return true
	case '-', '?', ':', ',', ']', '}', '#', '&', '*', '!', '|', '>', '%', '@', '`':
		return false
	}
	if i := bytes.Index(v, []byte(" #")); i >= 0 {
		v = bytes.TrimRight(v[:i], " ")
	}
	if v[len(v)-1] == ':' || bytes.Contains(v, []byte(": ")) {
		return false
	}
	switch plainKindOf(v) {
	case plainString:
		c.appendString(v)
	case plainInt:
		c.out = append(c.out, v...)
	case plainNull:
		c.out = append(c.out, "null"...)
	case plainTrue:
		c.out = append(c.out, "true"...)
	case plainFalse:
		c.out = append(c.out, "false"...)
	default:
		return false
	}
	return true
}

// onlyComment reports whether what follows a quoted scalar or {} on its line is nothing, or
// a comment.
func onlyComment(rest []byte) bool {
	if len(rest) == 0 {
		return true
	}
	return rest[0] == ' ' && bytes.TrimLeft(rest, " ")[0] == '#'
}

// appendString appends s (printable ASCII) as encoding/json writes it.
func (c *fastYAML) appendString(s []byte) {
	c.out = append(c.out, '"')
	for _, b := range s {
		switch b {
		case '"', '\\':
			c.out = append(c.out, '\\', b)
		case '<', '>', '&':
			c.out = append(c.out, `\u00`...)
			c.out = append(c.out, "0123456789abcdef"[b>>4], "0123456789abcdef"[b&0xf])
		default:
			c.out = append(c.out, b)
		}
	}
	c.out = append(c.out, '"')
}

// plainKind is what yaml.v2 makes of a plain scalar, as far as the fast path goes.
type plainKind int

const (
	plainOther  plainKind = iota // anything else: left to the slow path
	plainString                  // a string
	plainInt                     // a decimal integer, written as encoding/json writes it
	plainNull
	plainTrue
	plainFalse
)

// yamlWords are the plain scalars yaml.v2 resolves to booleans and null (YAML 1.1).
var yamlWords = map[string]plainKind{
	"y": plainTrue, "Y": plainTrue, "yes": plainTrue, "Yes": plainTrue, "YES": plainTrue,
	"true": plainTrue, "True": plainTrue, "TRUE": plainTrue, "on": plainTrue, "On": plainTrue, "ON": plainTrue,
	"n": plainFalse, "N": plainFalse, "no": plainFalse, "No": plainFalse, "NO": plainFalse,
	"false": plainFalse, "False": plainFalse, "FALSE": plainFalse, "off": plainFalse, "Off": plainFalse, "OFF": plainFalse,
	"~": plainNull, "null": plainNull, "Null": plainNull, "NULL": plainNull,
	".nan": plainOther, ".NaN": plainOther, ".NAN": plainOther, ".inf": plainOther, ".Inf": plainOther, ".INF": plainOther,
	"+.inf": plainOther, "+.Inf": plainOther, "+.INF": plainOther, "-.inf": plainOther, "-.Inf": plainOther, "-.INF": plainOther,
	"<<": plainOther,
}

// yamlStyleFloat is yaml.v2's.
var yamlStyleFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// plainKindOf follows yaml.v2's resolve for an untagged plain scalar, giving up (plainOther) on
// whatever would not be a string, a boolean, null or a plain decimal integer.
func plainKindOf(s []byte) plainKind {
	if k, ok := yamlWords[string(s)]; ok {
		return k
	}
	switch c := s[0]; {
	case c == '.':
		if _, err := strconv.ParseFloat(string(s), 64); err == nil {
			return plainOther
		}
		return plainString
	case c == '+' || c == '-' || '0' <= c && c <= '9':
		if decimal(s) {
			return plainInt
		}
		// A timestamp (yaml.v2 tries them when the scalar starts with four digits and "-").
		if len(s) > 4 && s[4] == '-' && decimal(s[:4]) {
			return plainOther
		}
		plain := bytes.ReplaceAll(s, []byte("_"), nil)
		if _, err := strconv.ParseInt(string(plain), 0, 64); err == nil {
			return plainOther
		}
		if _, err := strconv.ParseUint(string(plain), 0, 64); err == nil {
			return plainOther
		}
		if yamlStyleFloat.Match(plain) || bytes.HasPrefix(plain, []byte("0b")) || bytes.HasPrefix(plain, []byte("-0b")) {
			return plainOther
		}
	}
	return plainString
}

// decimal reports whether s is a decimal integer as encoding/json writes one that fits an int64
// (no sign, no leading zero).
func decimal(s []byte) bool {
	if len(s) == 0 || len(s) > 18 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for _, b := range s {
		if b < '0' || b > '9' {
			return false
		}
	}
	return true
}
