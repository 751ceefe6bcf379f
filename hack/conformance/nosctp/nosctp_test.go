// Package nosctp runs the network-policy-api conformance tests, unmodified, on a kernel without
// SCTP, as a diagnostic and not as conformance: its base manifests are the suite's own without
// the containers that serve SCTP (written into base/ by ./gen before the build, see
// hack/conformance.sh nosctp), so that the pods become Ready and the tests run. A test fails
// where it first probes SCTP; hack/conformance.sh and test/conformance tell those failures from
// the others by the probe's protocol.
package nosctp

import (
	"embed"
	"testing"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

//go:embed base
var manifests embed.FS

func TestConformanceWithoutSCTPServers(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatal(err)
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := suite.New(suite.Options{
		Client:               c,
		ClientSet:            clientset,
		KubeConfig:           *cfg,
		CleanupBaseResources: true,
		SupportedFeatures:    suite.AllFeatures,
		FS:                   &manifests,
	})
	s.Setup(t)
	s.Run(t, tests.ConformanceTests)
}
