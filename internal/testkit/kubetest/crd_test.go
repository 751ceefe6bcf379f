package kubetest

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

func TestEscapeModulePath(t *testing.T) {
	if got := escapeModulePath("github.com/BurntSushi/toml"); got != "github.com/!burnt!sushi/toml" {
		t.Errorf("got %s", got)
	}
}

// TestIntegrationClusterNetworkPolicyCRD installs each channel's CRD: the standard one prunes the
// experimental fields, the experimental one keeps them, and a deleted CRD is no longer served.
func TestIntegrationClusterNetworkPolicyCRD(t *testing.T) {
	s := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := npaclient.NewForConfigOrDie(s.AdminConfig()).PolicyV1beta1().ClusterNetworkPolicies()
	cnp := &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "to-nodes"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier:    npav1beta1.AdminTier,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{{Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{}}}}},
		},
	}

	for _, channel := range []CRDChannel{CRDStandard, CRDExperimental} {
		name := s.InstallCRD(t, ClusterNetworkPolicyCRD(t, channel))
		if name != ClusterNetworkPolicyCRDName {
			t.Errorf("CRD name %s", name)
		}
		got, err := client.Create(ctx, cnp, metav1.CreateOptions{})
		switch {
		case channel == CRDStandard:
			// The nodes field is pruned, which leaves a peer with no field.
			if err == nil || !strings.Contains(err.Error(), "spec.egress[0].to[0] in body should have at least 1 properties") {
				t.Errorf("standard channel: creating a policy with a nodes peer: %v, want the pruned peer refused", err)
			}
		case err != nil:
			t.Fatalf("%s: creating a ClusterNetworkPolicy right after the install: %v", channel, err)
		case got.Spec.Egress[0].To[0].Nodes == nil:
			t.Errorf("%s channel: the nodes peer was dropped", channel)
		}
		s.DeleteCRD(t, name)
		if _, err := client.List(ctx, metav1.ListOptions{}); err == nil {
			t.Errorf("%s: ClusterNetworkPolicies still listed after the CRD was deleted", channel)
		}
	}
}
