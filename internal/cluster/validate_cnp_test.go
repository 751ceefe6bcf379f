package cluster

import (
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// validCNP uses every kind of field once, validly.
func validCNP() *npav1beta1.ClusterNetworkPolicy {
	sel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	return &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"owner": "sec"}},
		Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier:     npav1beta1.AdminTier,
			Priority: 10,
			Subject:  npav1beta1.ClusterNetworkPolicySubject{Namespaces: sel("team", "a")},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{{
				Name:   "from-monitoring",
				Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
				From: []npav1beta1.ClusterNetworkPolicyIngressPeer{
					{Namespaces: sel("kubernetes.io/metadata.name", "monitoring")},
					{Pods: &npav1beta1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
						{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}}},
				},
				Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{
					{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: 9090}}},
					{DestinationNamedPort: "metrics"},
				},
			}},
			Egress: []npav1beta1.ClusterNetworkPolicyEgressRule{
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{
					{Networks: []npav1beta1.CIDR{"10.0.0.0/8", "fd00::/8", "192.0.2.1/32"}},
					{Nodes: sel("role", "infra")},
					{DomainNames: []npav1beta1.DomainName{"example.com", "*.example.org"}},
					{}, // a field this version does not know: kept, the compiler fails closed
				}},
				{Action: npav1beta1.ClusterNetworkPolicyRuleActionPass, To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Namespaces: &metav1.LabelSelector{}}},
					Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{
						{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1beta1.Port{Range: &npav1beta1.PortRange{Start: 1, End: 65535}}}},
						{SCTP: &npav1beta1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: &npav1beta1.Port{Number: 65535}}},
					}},
			},
		},
	}
}

func TestValidateClusterNetworkPolicy(t *testing.T) {
	if errs := ValidateClusterNetworkPolicy(validCNP()); len(errs) != 0 {
		t.Fatalf("valid policy: %v", errs)
	}
	peers := func(n int) []npav1beta1.ClusterNetworkPolicyEgressPeer {
		out := make([]npav1beta1.ClusterNetworkPolicyEgressPeer, n)
		for i := range out {
			out[i].Namespaces = &metav1.LabelSelector{}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		change func(*npav1beta1.ClusterNetworkPolicy)
		want   []string // one substring per error, in order
	}{
		{"no name", func(c *npav1beta1.ClusterNetworkPolicy) { c.Name = "" }, []string{"metadata.name: Required value"}},
		{"bad name", func(c *npav1beta1.ClusterNetworkPolicy) { c.Name = "Bad_Name" }, []string{`metadata.name: Invalid value: "Bad_Name"`}},
		{"bad label", func(c *npav1beta1.ClusterNetworkPolicy) { c.Labels = map[string]string{"a b": "c"} }, []string{`metadata.labels: Invalid value: "a b"`}},
		{"no tier", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Tier = "" }, []string{"spec.tier: Required value: must be Admin or Baseline"}},
		{"bad tier", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Tier = "admin" },
			[]string{`spec.tier: Unsupported value: "admin": supported values: "Admin", "Baseline"`}},
		{"priority low", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Priority = -1 }, []string{"spec.priority: Invalid value: -1: must be between 0 and 1000"}},
		{"priority high", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Priority = 1001 }, []string{"spec.priority: Invalid value: 1001"}},
		{"priority bounds", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Priority = 1000 }, nil},
		{"no subject", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Subject = npav1beta1.ClusterNetworkPolicySubject{} },
			[]string{"spec.subject: Required value: exactly one of namespaces or pods must be set"}},
		{"two subjects", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Subject.Pods = &npav1beta1.NamespacedPod{} },
			[]string{`spec.subject: Invalid value: "namespaces, pods": exactly one of namespaces or pods must be set`}},
		{"subject selector does not parse", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Subject = npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{
				NamespaceSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Has"}}}}}
		}, []string{`spec.subject.pods.namespaceSelector.matchExpressions[0]: Invalid value: "a Has []": "Has" is not a valid label selector operator`}},
		{"26 egress rules", func(c *npav1beta1.ClusterNetworkPolicy) {
			for len(c.Spec.Egress) < 26 {
				c.Spec.Egress = append(c.Spec.Egress, c.Spec.Egress[1])
			}
		}, []string{"spec.egress: Too many: 26: must have at most 25 items"}},
		{"26 ingress rules", func(c *npav1beta1.ClusterNetworkPolicy) {
			for len(c.Spec.Ingress) < 26 {
				c.Spec.Ingress = append(c.Spec.Ingress, c.Spec.Ingress[0])
			}
		}, []string{"spec.ingress: Too many: 26: must have at most 25 items"}},
		{"rule name too long", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Ingress[0].Name = strings.Repeat("n", 101) },
			[]string{"spec.ingress[0].name: Too long: may not be more than 100"}},
		{"no action", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[1].Action = "" },
			[]string{"spec.egress[1].action: Required value"}},
		{"bad action", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Ingress[0].Action = "Allow" },
			[]string{`spec.ingress[0].action: Unsupported value: "Allow": supported values: "Accept", "Deny", "Pass"`}},
		{"no from", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Ingress[0].From = nil },
			[]string{"spec.ingress[0].from: Required value: must have at least 1 item"}},
		{"empty to", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].To = []npav1beta1.ClusterNetworkPolicyEgressPeer{}
		},
			[]string{"spec.egress[1].to: Invalid value: \"[]\": must have at least 1 item"}},
		{"26 peers", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[1].To = peers(26) },
			[]string{"spec.egress[1].to: Too many: 26: must have at most 25 items"}},
		{"25 peers", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[1].To = peers(25) }, nil},
		{"peer with two fields", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[0].To[1].Networks = []npav1beta1.CIDR{"10.0.0.0/8"}
		}, []string{`spec.egress[0].to[1]: Invalid value: "nodes, networks": at most one of namespaces, pods, nodes, networks, domainNames may be set`}},
		{"ingress peer with two fields", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].From[0].Pods = &npav1beta1.NamespacedPod{}
		}, []string{`spec.ingress[0].from[0]: Invalid value: "namespaces, pods": at most one of namespaces, pods may be set`}},
		{"peer selector does not parse", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[0].To[1].Nodes = &metav1.LabelSelector{MatchLabels: map[string]string{"role": "in fra"}}
		}, []string{`spec.egress[0].to[1].nodes.matchLabels[role]: Invalid value: "in fra"`}},
		{"pod selector does not parse", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].From[1].Pods.PodSelector.MatchExpressions[0].Values = nil
		}, []string{`spec.ingress[0].from[1].pods.podSelector.matchExpressions[0]: Invalid value: "app In []": values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty`}},
		{"CIDR with too long a prefix", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[0].To[0].Networks[2] = "10.0.0.0/33"
		}, []string{`spec.egress[0].to[0].networks[2]: Invalid value: "10.0.0.0/33": invalid CIDR`}},
		{"address without a prefix", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[0].To[0].Networks[0] = "10.0.0.1" },
			[]string{`spec.egress[0].to[0].networks[0]: Invalid value: "10.0.0.1": invalid CIDR`}},
		{"CIDR not masked", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[0].To[0].Networks[1] = "fd00::1/8" },
			[]string{`spec.egress[0].to[0].networks[1]: Invalid value: "fd00::1/8": invalid CIDR: bits are set after the mask; did you mean fd00::/8?`}},
		{"IPv4-mapped IPv6", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[0].To[0].Networks[0] = "::ffff:10.0.0.0/104" },
			[]string{`spec.egress[0].to[0].networks[0]: Invalid value: "::ffff:10.0.0.0/104": invalid CIDR: IPv4-mapped`}},
		{"duplicate CIDR", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[0].To[0].Networks[2] = "10.0.0.0/8" },
			[]string{`spec.egress[0].to[0].networks[2]: Duplicate value: "10.0.0.0/8"`}},
		{"empty networks", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[0].To[0].Networks = []npav1beta1.CIDR{} },
			[]string{`spec.egress[0].to[0].networks: Invalid value: "[]": must have at least 1 item`}},
		{"26 networks", func(c *npav1beta1.ClusterNetworkPolicy) {
			nets := make([]npav1beta1.CIDR, 26)
			for i := range nets {
				nets[i] = npav1beta1.CIDR("10.0." + strconv.Itoa(i) + ".0/24")
			}
			c.Spec.Egress[0].To[0].Networks = nets
		}, []string{"spec.egress[0].to[0].networks: Too many: 26: must have at most 25 items"}},
		{"bad domain name", func(c *npav1beta1.ClusterNetworkPolicy) { c.Spec.Egress[0].To[2].DomainNames[1] = "*example.org" },
			[]string{`spec.egress[0].to[2].domainNames[1]: Invalid value: "*example.org"`}},
		{"domainNames under Deny", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[0].Action = npav1beta1.ClusterNetworkPolicyRuleActionDeny
		},
			[]string{`spec.egress[0].to[2].domainNames: Invalid value: "Deny": domainNames peers are allowed only in Accept rules`}},
		{"port 0 is no port", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].Protocols[0].TCP.DestinationPort.Number = 0
		}, []string{"spec.ingress[0].protocols[0].tcp.destinationPort: Required value: exactly one of number or range must be set"}},
		{"port too high", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].Protocols[0].TCP.DestinationPort.Number = 65536
		},
			[]string{"spec.ingress[0].protocols[0].tcp.destinationPort.number: Invalid value: 65536: must be between 1 and 65535"}},
		{"negative port", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].Protocols[1].SCTP.DestinationPort.Number = -5
		},
			[]string{"spec.egress[1].protocols[1].sctp.destinationPort.number: Invalid value: -5"}},
		{"number and range", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].Protocols[0].UDP.DestinationPort.Number = 53
		}, []string{`spec.egress[1].protocols[0].udp.destinationPort: Invalid value: "number 53, range 1-65535": exactly one of number or range must be set`}},
		{"range start not below end", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].Protocols[0].UDP.DestinationPort.Range = &npav1beta1.PortRange{Start: 80, End: 80}
		}, []string{`spec.egress[1].protocols[0].udp.destinationPort.range: Invalid value: "80-80": start port must be less than end port`}},
		{"range out of bounds", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].Protocols[0].UDP.DestinationPort.Range = &npav1beta1.PortRange{Start: 0, End: 70000}
		}, []string{"range.start: Invalid value: 0: must be between 1 and 65535", "range.end: Invalid value: 70000"}},
		{"tcp without a port", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].Protocols[0].TCP.DestinationPort = nil
		}, []string{"spec.ingress[0].protocols[0].tcp.destinationPort: Required value"}},
		{"empty protocol", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].Protocols[1] = npav1beta1.ClusterNetworkPolicyProtocol{}
		}, []string{"spec.ingress[0].protocols[1]: Required value: exactly one of tcp, udp, sctp, destinationNamedPort must be set"}},
		{"protocol with two fields", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Ingress[0].Protocols[1].UDP = &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1beta1.Port{Number: 1}}
		}, []string{`spec.ingress[0].protocols[1]: Invalid value: "udp, destinationNamedPort"`}},
		{"empty protocols", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].Protocols = []npav1beta1.ClusterNetworkPolicyProtocol{}
		}, []string{`spec.egress[1].protocols: Invalid value: "[]": must have at least 1 item`}},
		{"named port towards networks", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[0].Protocols = []npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}
		}, []string{`spec.egress[0].protocols[0].destinationNamedPort: Invalid value: "http": may not be used in a rule with networks, nodes or domainNames peers`}},
		{"named port towards pods", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Egress[1].Protocols = []npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}
		}, nil},
		{"errors add up", func(c *npav1beta1.ClusterNetworkPolicy) {
			c.Spec.Tier, c.Spec.Priority = "Top", 5000
		}, []string{"spec.tier: Unsupported value", "spec.priority: Invalid value: 5000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validCNP()
			tc.change(c)
			errs := ValidateClusterNetworkPolicy(c)
			if len(errs) != len(tc.want) {
				t.Fatalf("got %d errors, want %d: %v", len(errs), len(tc.want), errs)
			}
			for i, w := range tc.want {
				if !strings.Contains(errs[i].Error(), w) {
					t.Errorf("error %d:\n got  %s\n want substring %s", i, errs[i], w)
				}
			}
		})
	}
}

func TestClusterPolicyError(t *testing.T) {
	c := validCNP()
	if err := ClusterPolicyError(c); err != nil {
		t.Fatalf("valid: %v", err)
	}
	c.Spec.Egress[0].To[0].Networks[2] = "10.0.0.0/33"
	c.Spec.Priority = 1001
	err := ClusterPolicyError(c)
	want := `ClusterNetworkPolicy "x": spec.priority: Invalid value: 1001: must be between 0 and 1000; ` +
		`spec.egress[0].to[0].networks[2]: Invalid value: "10.0.0.0/33": invalid CIDR: must be an IPv4 or IPv6 network such as 10.0.0.0/8 or fd00::/8`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}
