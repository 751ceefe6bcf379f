//go:build conformance_deps

// Package conformance is never built: it imports what the upstream test package
// sigs.k8s.io/network-policy-api/conformance (and its test files) imports, so that go mod tidy
// keeps those requirements. hack/conformance.sh compiles the upstream package itself, unmodified.
package conformance

import (
	_ "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	_ "k8s.io/apimachinery/pkg/util/sets"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/client-go/rest"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "sigs.k8s.io/controller-runtime/pkg/client"
	_ "sigs.k8s.io/controller-runtime/pkg/client/config"
	_ "sigs.k8s.io/network-policy-api/apis/v1beta1"
	_ "sigs.k8s.io/network-policy-api/conformance"
	_ "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	_ "sigs.k8s.io/network-policy-api/conformance/tests"
	_ "sigs.k8s.io/network-policy-api/conformance/utils/flags"
	_ "sigs.k8s.io/network-policy-api/conformance/utils/suite"
	_ "sigs.k8s.io/yaml"
)
