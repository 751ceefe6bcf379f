// Package conformance runs the field's own suites, unmodified, against a Kubernetes cluster of
// several nodes on this machine (internal/testkit/minicluster) with netwarden on every node:
// the Kubernetes e2e NetworkPolicy tests (e2e.test of k8s.io/kubernetes) and the
// network-policy-api conformance suite (hack/conformance.sh). make conformance runs them in
// full on both backends; make test runs a part of the e2e suite on one.
package conformance
