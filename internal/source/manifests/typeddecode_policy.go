package manifests

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// decodePolicy is decodeNamespace for a NetworkPolicy.
func decodePolicy(raw []byte) (*networkingv1.NetworkPolicy, bool) {
	d := typedDecoder{b: raw, ok: true}
	o := new(networkingv1.NetworkPolicy)
	d.object(func(key []byte) {
		if d.typeAndMeta(key, &o.TypeMeta, &o.ObjectMeta) {
			return
		}
		switch string(key) {
		case "spec":
			d.policySpec(&o.Spec)
		default:
			d.ok = false
		}
	})
	return o, d.end()
}

func (d *typedDecoder) policySpec(s *networkingv1.NetworkPolicySpec) {
	d.object(func(key []byte) {
		switch string(key) {
		case "podSelector":
			d.selector(&s.PodSelector)
		case "policyTypes":
			d.array(func() {
				d.internedAs(func(v string) { s.PolicyTypes = append(s.PolicyTypes, networkingv1.PolicyType(v)) })
			}, func() { s.PolicyTypes = []networkingv1.PolicyType{} })
		case "ingress":
			d.array(func() {
				var r networkingv1.NetworkPolicyIngressRule
				d.object(func(key []byte) {
					switch string(key) {
					case "ports":
						d.policyPorts(&r.Ports)
					case "from":
						d.policyPeers(&r.From)
					default:
						d.ok = false
					}
				})
				s.Ingress = append(s.Ingress, r)
			}, func() { s.Ingress = []networkingv1.NetworkPolicyIngressRule{} })
		case "egress":
			d.array(func() {
				var r networkingv1.NetworkPolicyEgressRule
				d.object(func(key []byte) {
					switch string(key) {
					case "ports":
						d.policyPorts(&r.Ports)
					case "to":
						d.policyPeers(&r.To)
					default:
						d.ok = false
					}
				})
				s.Egress = append(s.Egress, r)
			}, func() { s.Egress = []networkingv1.NetworkPolicyEgressRule{} })
		default:
			d.ok = false
		}
	})
}

func (d *typedDecoder) policyPorts(ports *[]networkingv1.NetworkPolicyPort) {
	d.array(func() {
		var p networkingv1.NetworkPolicyPort
		d.object(func(key []byte) {
			switch string(key) {
			case "protocol":
				d.internedAs(func(s string) {
					proto := corev1.Protocol(s)
					p.Protocol = &proto
				})
			case "port":
				p.Port = d.intOrString()
			case "endPort":
				v := int32(d.integer(32))
				p.EndPort = &v
			default:
				d.ok = false
			}
		})
		*ports = append(*ports, p)
	}, func() { *ports = []networkingv1.NetworkPolicyPort{} })
}

func (d *typedDecoder) policyPeers(peers *[]networkingv1.NetworkPolicyPeer) {
	d.array(func() {
		var p networkingv1.NetworkPolicyPeer
		d.object(func(key []byte) {
			switch string(key) {
			case "podSelector":
				p.PodSelector = new(metav1.LabelSelector)
				d.selector(p.PodSelector)
			case "namespaceSelector":
				p.NamespaceSelector = new(metav1.LabelSelector)
				d.selector(p.NamespaceSelector)
			case "ipBlock":
				p.IPBlock = new(networkingv1.IPBlock)
				d.object(func(key []byte) {
					switch string(key) {
					case "cidr":
						d.str(&p.IPBlock.CIDR)
					case "except":
						d.stringArray(&p.IPBlock.Except)
					default:
						d.ok = false
					}
				})
			default:
				d.ok = false
			}
		})
		*peers = append(*peers, p)
	}, func() { *peers = []networkingv1.NetworkPolicyPeer{} })
}

func (d *typedDecoder) selector(s *metav1.LabelSelector) {
	d.object(func(key []byte) {
		switch string(key) {
		case "matchLabels":
			d.stringMap(&s.MatchLabels)
		case "matchExpressions":
			d.array(func() {
				var r metav1.LabelSelectorRequirement
				d.object(func(key []byte) {
					switch string(key) {
					case "key":
						d.internedAs(func(v string) { r.Key = v })
					case "operator":
						d.internedAs(func(v string) { r.Operator = metav1.LabelSelectorOperator(v) })
					case "values":
						d.array(func() {
							d.internedAs(func(v string) { r.Values = append(r.Values, v) })
						}, func() { r.Values = []string{} })
					default:
						d.ok = false
					}
				})
				s.MatchExpressions = append(s.MatchExpressions, r)
			}, func() { s.MatchExpressions = []metav1.LabelSelectorRequirement{} })
		default:
			d.ok = false
		}
	})
}
