// Package lint finds the NetworkPolicy and ClusterNetworkPolicy mistakes that break clusters
// in a snapshot of cluster state: egress isolation that cuts pods off the cluster DNS, selectors
// and named ports that match nothing today, ipBlock excepts outside their block, rules of a
// ClusterNetworkPolicy that can never be reached, Deny rules over the nodes' addresses,
// priorities that collide, and policies a backend cannot express. It judges with the same
// policy model the agent programs, so a finding is what the kernel would do.
package lint

import (
	"cmp"
	"fmt"
	"slices"
)

// Severity says whether a finding breaks traffic (an error: lint exits non-zero) or is likely a
// mistake that breaks nothing yet (a warning).
type Severity string

const (
	Error   Severity = "error"
	Warning Severity = "warning"
)

// Finding is one mistake: the object and the part of it at fault, what is wrong, why it
// matters, and what to change.
type Finding struct {
	Severity Severity `json:"severity"`
	Check    string   `json:"check"`  // which check found it, such as "dns-egress"
	Object   string   `json:"object"` // "NetworkPolicy ns/name" or "ClusterNetworkPolicy name"
	Field    string   `json:"field,omitempty"`
	Problem  string   `json:"problem"`
	Why      string   `json:"why"`
	Fix      string   `json:"fix"`
}

func (f Finding) String() string {
	where := f.Object
	if f.Field != "" {
		where += " " + f.Field
	}
	return fmt.Sprintf("%s: %s: %s (%s)\n  why: %s\n  fix: %s", f.Severity, where, f.Problem, f.Check, f.Why, f.Fix)
}

// Report is what a run found, and what it could not check.
type Report struct {
	Findings []Finding `json:"findings"`
	// Notes say which checks could not run on this state, and why (no cluster DNS pods).
	Notes []string `json:"notes,omitempty"`
}

// Errors counts the findings of severity Error.
func (r *Report) Errors() int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == Error {
			n++
		}
	}
	return n
}

func (r *Report) add(f Finding) { r.Findings = append(r.Findings, f) }

// AddInvalid reports objects the source refused (each error names the file, document and
// field): the agent keeps the last good objects of such a file, so these are not applied.
func (r *Report) AddInvalid(errs []error) {
	for _, err := range errs {
		r.add(Finding{Severity: Error, Check: "invalid", Object: "manifest", Problem: err.Error(),
			Why: "the agent refuses it: the policy it holds is not applied as written (the last good version of its file stays)",
			Fix: "correct the field the problem names"})
	}
	r.sort()
}

// sort orders the findings by object, field and check, so that output is stable.
func (r *Report) sort() {
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Field, b.Field), cmp.Compare(a.Check, b.Check), cmp.Compare(a.Problem, b.Problem))
	})
}
