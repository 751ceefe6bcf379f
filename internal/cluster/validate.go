package cluster

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The checks below mirror the API server's for the fields that the agent interprets. Objects read
// from the API already passed them; objects read from files did not, and a bad one must be rejected
// with a message naming the field rather than silently compiled into wrong rules.

func validateMeta(m metavTyped, namespaced bool) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("metadata")
	if m.GetName() == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else if namespaced {
		for _, msg := range validation.IsDNS1123Subdomain(m.GetName()) {
			errs = append(errs, field.Invalid(p.Child("name"), m.GetName(), msg))
		}
	} else {
		for _, msg := range validation.IsDNS1123Label(m.GetName()) {
			errs = append(errs, field.Invalid(p.Child("name"), m.GetName(), msg))
		}
	}
	if namespaced {
		for _, msg := range validation.IsDNS1123Label(m.GetNamespace()) {
			errs = append(errs, field.Invalid(p.Child("namespace"), m.GetNamespace(), msg))
		}
	}
	errs = append(errs, metav1validation.ValidateLabels(m.GetLabels(), p.Child("labels"))...)
	return errs
}

type metavTyped interface {
	GetName() string
	GetNamespace() string
	GetLabels() map[string]string
}

// ValidateNamespace checks a Namespace.
func ValidateNamespace(ns *corev1.Namespace) field.ErrorList {
	return validateMeta(ns, false)
}

// ValidateNode checks the Node fields the agent reads.
func ValidateNode(node *corev1.Node) field.ErrorList {
	errs := validateMeta(node, false)
	p := field.NewPath("spec", "podCIDRs")
	families := map[bool]bool{}
	for i, c := range node.Spec.PodCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, field.Invalid(p.Index(i), c, "must be a CIDR such as 10.244.1.0/24"))
			continue
		}
		if pfx.Masked() != pfx {
			errs = append(errs, field.Invalid(p.Index(i), c, fmt.Sprintf("not network-aligned; did you mean %s?", pfx.Masked())))
		}
		if families[pfx.Addr().Is4()] {
			errs = append(errs, field.Invalid(p.Index(i), c, "at most one CIDR per IP family"))
		}
		families[pfx.Addr().Is4()] = true
	}
	return errs
}

// ValidatePod checks the Pod fields the agent reads.
func ValidatePod(pod *corev1.Pod) field.ErrorList {
	errs := validateMeta(pod, true)
	p := field.NewPath("status", "podIPs")
	families := map[bool]bool{}
	for i, ip := range pod.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil || a.Zone() != "" {
			errs = append(errs, field.Invalid(p.Index(i).Child("ip"), ip.IP, "must be an IPv4 or IPv6 address"))
			continue
		}
		a = a.Unmap()
		if families[a.Is4()] {
			errs = append(errs, field.Invalid(p.Index(i).Child("ip"), ip.IP, "at most one IP per family"))
		}
		families[a.Is4()] = true
	}
	if pod.Status.PodIP != "" && len(pod.Status.PodIPs) > 0 && pod.Status.PodIP != pod.Status.PodIPs[0].IP {
		errs = append(errs, field.Invalid(field.NewPath("status", "podIP"), pod.Status.PodIP, "must equal status.podIPs[0].ip"))
	}
	for _, c := range []struct {
		name string
		list []corev1.Container
	}{{"initContainers", pod.Spec.InitContainers}, {"containers", pod.Spec.Containers}} {
		for i, ctr := range c.list {
			cp := field.NewPath("spec", c.name).Index(i).Child("ports")
			for j, port := range ctr.Ports {
				pp := cp.Index(j)
				if port.ContainerPort < 1 || port.ContainerPort > 65535 {
					errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, "must be between 1 and 65535"))
				}
				if port.Name != "" {
					for _, msg := range validation.IsValidPortName(port.Name) {
						errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
					}
				}
				errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
			}
		}
	}
	return errs
}

func validateProtocol(proto corev1.Protocol, p *field.Path) field.ErrorList {
	switch proto {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, proto, []string{"TCP", "UDP", "SCTP"})}
}

// ValidateNetworkPolicy checks a (defaulted) NetworkPolicy as the API server would.
func ValidateNetworkPolicy(np *networkingv1.NetworkPolicy) field.ErrorList {
	errs := validateMeta(np, true)
	spec := field.NewPath("spec")
	opts := metav1validation.LabelSelectorValidationOptions{}
	errs = append(errs, metav1validation.ValidateLabelSelector(&np.Spec.PodSelector, opts, spec.Child("podSelector"))...)
	for i, rule := range np.Spec.Ingress {
		rp := spec.Child("ingress").Index(i)
		errs = append(errs, validatePorts(rule.Ports, rp.Child("ports"))...)
		errs = append(errs, validatePeers(rule.From, rp.Child("from"))...)
	}
	for i, rule := range np.Spec.Egress {
		rp := spec.Child("egress").Index(i)
		errs = append(errs, validatePorts(rule.Ports, rp.Child("ports"))...)
		errs = append(errs, validatePeers(rule.To, rp.Child("to"))...)
	}
	seen := map[networkingv1.PolicyType]bool{}
	for i, pt := range np.Spec.PolicyTypes {
		pp := spec.Child("policyTypes").Index(i)
		if pt != networkingv1.PolicyTypeIngress && pt != networkingv1.PolicyTypeEgress {
			errs = append(errs, field.NotSupported(pp, pt, []string{"Ingress", "Egress"}))
		} else if seen[pt] {
			errs = append(errs, field.Duplicate(pp, pt))
		}
		seen[pt] = true
	}
	return errs
}

func validatePorts(ports []networkingv1.NetworkPolicyPort, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, port := range ports {
		pp := p.Index(i)
		if port.Protocol != nil {
			errs = append(errs, validateProtocol(*port.Protocol, pp.Child("protocol"))...)
		}
		if port.Port == nil {
			if port.EndPort != nil {
				errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "may not be specified when port is not specified"))
			}
			continue
		}
		if port.Port.Type == intstr.Int {
			v := port.Port.IntVal
			if v < 1 || v > 65535 {
				errs = append(errs, field.Invalid(pp.Child("port"), v, "must be between 1 and 65535"))
			}
			if port.EndPort != nil {
				if *port.EndPort < v {
					errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "must be greater than or equal to port"))
				}
				if *port.EndPort > 65535 {
					errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "must be between 1 and 65535"))
				}
			}
			continue
		}
		for _, msg := range validation.IsValidPortName(port.Port.StrVal) {
			errs = append(errs, field.Invalid(pp.Child("port"), port.Port.StrVal, msg))
		}
		if port.EndPort != nil {
			errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "may not be specified when port is a named port"))
		}
	}
	return errs
}

func validatePeers(peers []networkingv1.NetworkPolicyPeer, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	opts := metav1validation.LabelSelectorValidationOptions{}
	for i, peer := range peers {
		pp := p.Index(i)
		selectors := peer.PodSelector != nil || peer.NamespaceSelector != nil
		switch {
		case peer.IPBlock != nil && selectors:
			errs = append(errs, field.Forbidden(pp, "may not specify ipBlock together with podSelector or namespaceSelector"))
		case peer.IPBlock == nil && !selectors:
			errs = append(errs, field.Required(pp, "must specify ipBlock, podSelector or namespaceSelector"))
		}
		if peer.PodSelector != nil {
			errs = append(errs, metav1validation.ValidateLabelSelector(peer.PodSelector, opts, pp.Child("podSelector"))...)
		}
		if peer.NamespaceSelector != nil {
			errs = append(errs, metav1validation.ValidateLabelSelector(peer.NamespaceSelector, opts, pp.Child("namespaceSelector"))...)
		}
		if peer.IPBlock != nil {
			errs = append(errs, validateIPBlock(peer.IPBlock, pp.Child("ipBlock"))...)
		}
	}
	return errs
}

func validateIPBlock(b *networkingv1.IPBlock, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return append(errs, field.Invalid(p.Child("cidr"), b.CIDR, "must be a CIDR such as 10.0.0.0/8"))
	}
	cidr = cidr.Masked()
	for i, ex := range b.Except {
		e, err := netip.ParsePrefix(ex)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child("except").Index(i), ex, "must be a CIDR"))
			continue
		}
		if e.Addr().Is4() != cidr.Addr().Is4() || e.Bits() <= cidr.Bits() || !cidr.Contains(e.Addr()) {
			errs = append(errs, field.Invalid(p.Child("except").Index(i), ex, fmt.Sprintf("must be a strict subset of %s", b.CIDR)))
		}
	}
	return errs
}
