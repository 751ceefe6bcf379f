package manifests

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Error is one problem found in a manifest file. Its message names the file, the document and
// List item, the object, and (for validation and strict decoding problems) the field, e.g.
//
//	examples/policies.yaml: document 3 (NetworkPolicy default/allow-web): spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and 65535
type Error struct {
	// File is the file's path (the directory given to Load or New joined with the file name).
	File string
	// Document is the 1-based number of the document in the file, counting non-empty YAML
	// documents (or JSON values); 0 when the problem concerns the whole file (e.g. unreadable).
	Document int
	// Line is the 1-based line of the file where the document starts (YAML only; 0 if unknown).
	Line int
	// Item is the 0-based index in the items of a List document, or -1.
	Item int
	// Kind, Namespace and Name identify the object when they are known.
	Kind, Namespace, Name string
	// Field is the field path of the problem when there is one (e.g. "spec.ingress[0].ports[0].port").
	Field string
	// Err is the problem itself; for validation problems a *field.Error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Document > 0 {
		fmt.Fprintf(&b, ": document %d", e.Document)
		if e.Item >= 0 {
			fmt.Fprintf(&b, ", items[%d]", e.Item)
		}
	}
	if e.Kind != "" {
		b.WriteString(" (")
		b.WriteString(e.Kind)
		switch {
		case e.Name != "" && e.Namespace != "":
			b.WriteString(" " + e.Namespace + "/" + e.Name)
		case e.Name != "":
			b.WriteString(" " + e.Name)
		}
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// location identifies where a document or object lives, for error messages.
type location struct {
	file     string
	doc      int
	line     int
	item     int
	kind     string
	ns, name string
}

func (l location) err(err error) *Error {
	e := &Error{File: l.file, Document: l.doc, Line: l.line, Item: l.item, Kind: l.kind, Namespace: l.ns, Name: l.name, Err: err}
	if fe, ok := err.(*field.Error); ok {
		e.Field = fe.Field
	}
	return e
}

func (l location) errorf(format string, args ...any) *Error {
	return l.err(fmt.Errorf(format, args...))
}

// strictErr wraps an unknown or duplicate field error from strict decoding, recording its field.
func (l location) strictErr(err error) *Error {
	e := l.err(err)
	if fp, ok := err.(interface{ FieldPath() string }); ok {
		e.Field = fp.FieldPath()
	}
	return e
}

// docRef names the document (and List item) of a location, e.g. "document 2, items[0]".
func (l location) docRef() string {
	s := fmt.Sprintf("document %d", l.doc)
	if l.item >= 0 {
		s += fmt.Sprintf(", items[%d]", l.item)
	}
	return s
}

func compareErrors(a, b error) int {
	var ea, eb *Error
	okA, okB := errors.As(a, &ea), errors.As(b, &eb)
	if !okA || !okB {
		return 0
	}
	return cmp.Or(cmp.Compare(ea.File, eb.File), cmp.Compare(ea.Document, eb.Document), cmp.Compare(ea.Item, eb.Item))
}

// unwrapPathError drops the path from an *fs.PathError, for messages that name the path already.
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
