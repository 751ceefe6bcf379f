package cluster

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Limits of the ClusterNetworkPolicy CRD (sigs.k8s.io/network-policy-api v0.3.0).
const (
	cnpMaxPriority   = 1000
	cnpMaxRules      = 25 // rules per direction
	cnpMaxItems      = 25 // peers, protocols, networks and domain names per list
	cnpMaxRuleName   = 100
	cnpMaxCIDRLength = 43
)

// cnpDomainName is the CRD's pattern for DomainName.
var cnpDomainName = regexp.MustCompile(`^(\*\.)?([a-zA-Z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-Z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`)

// ValidateClusterNetworkPolicy checks a ClusterNetworkPolicy as the API server does with the CRD
// of network-policy-api v0.3.0 (its OpenAPI schema and CEL rules, experimental fields included),
// plus that every label selector parses, which the CRD leaves to implementations. Objects from the
// API passed the CRD already, unless it is another version of it or was installed without
// validation; objects from files passed nothing.
//
// One thing the CRD rejects is accepted, because the policy compiler has a meaning for it
// that must not be lost (and one it accepts is refused: a domainNames peer in a rule whose
// action is not Accept, which the API documents but does not check):
//   - a peer with no field set: the CRD requires exactly one, so an empty peer is one whose field
//     this version does not know (pruned by an older CRD, or newer than our API types). The
//     compiler fails closed on it, as the API asks.
func ValidateClusterNetworkPolicy(cnp *npav1beta1.ClusterNetworkPolicy) field.ErrorList {
	errs := validateClusterMeta(&cnp.ObjectMeta)
	spec := &cnp.Spec
	sp := field.NewPath("spec")
	switch spec.Tier {
	case npav1beta1.AdminTier, npav1beta1.BaselineTier:
	case "":
		errs = append(errs, field.Required(sp.Child("tier"), "must be Admin or Baseline"))
	default:
		errs = append(errs, field.NotSupported(sp.Child("tier"), spec.Tier, []string{string(npav1beta1.AdminTier), string(npav1beta1.BaselineTier)}))
	}
	if spec.Priority < 0 || spec.Priority > cnpMaxPriority {
		errs = append(errs, field.Invalid(sp.Child("priority"), spec.Priority, fmt.Sprintf("must be between 0 and %d", cnpMaxPriority)))
	}

	subj := sp.Child("subject")
	switch n := countSet(spec.Subject.Namespaces != nil, spec.Subject.Pods != nil); {
	case n == 0:
		errs = append(errs, field.Required(subj, "exactly one of namespaces or pods must be set"))
	case n > 1:
		errs = append(errs, field.Invalid(subj, "namespaces, pods", "exactly one of namespaces or pods must be set"))
	}
	errs = append(errs, validateSelector(spec.Subject.Namespaces, subj.Child("namespaces"))...)
	errs = append(errs, validateNamespacedPod(spec.Subject.Pods, subj.Child("pods"))...)

	if len(spec.Ingress) > cnpMaxRules {
		errs = append(errs, field.TooMany(sp.Child("ingress"), len(spec.Ingress), cnpMaxRules))
	}
	for i := range spec.Ingress {
		r := &spec.Ingress[i]
		rp := sp.Child("ingress").Index(i)
		errs = append(errs, validateRuleHead(r.Name, r.Action, rp)...)
		errs = append(errs, validateListSize(len(r.From), r.From == nil, rp.Child("from"), true)...)
		for j := range r.From {
			peer := &r.From[j]
			pp := rp.Child("from").Index(j)
			errs = append(errs, atMostOne(pp, []string{"namespaces", "pods"}, peer.Namespaces != nil, peer.Pods != nil)...)
			errs = append(errs, validateSelector(peer.Namespaces, pp.Child("namespaces"))...)
			errs = append(errs, validateNamespacedPod(peer.Pods, pp.Child("pods"))...)
		}
		errs = append(errs, validateProtocols(r.Protocols, rp.Child("protocols"))...)
	}

	if len(spec.Egress) > cnpMaxRules {
		errs = append(errs, field.TooMany(sp.Child("egress"), len(spec.Egress), cnpMaxRules))
	}
	for i := range spec.Egress {
		r := &spec.Egress[i]
		rp := sp.Child("egress").Index(i)
		errs = append(errs, validateRuleHead(r.Name, r.Action, rp)...)
		errs = append(errs, validateListSize(len(r.To), r.To == nil, rp.Child("to"), true)...)
		addressPeer := false // a peer that has no named ports: networks, nodes, domainNames
		for j := range r.To {
			peer := &r.To[j]
			pp := rp.Child("to").Index(j)
			errs = append(errs, atMostOne(pp, []string{"namespaces", "pods", "nodes", "networks", "domainNames"},
				peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil, peer.Networks != nil, peer.DomainNames != nil)...)
			errs = append(errs, validateSelector(peer.Namespaces, pp.Child("namespaces"))...)
			errs = append(errs, validateNamespacedPod(peer.Pods, pp.Child("pods"))...)
			errs = append(errs, validateSelector(peer.Nodes, pp.Child("nodes"))...)
			if peer.Networks != nil {
				errs = append(errs, validateNetworks(peer.Networks, pp.Child("networks"))...)
			}
			if peer.DomainNames != nil {
				errs = append(errs, validateDomainNames(peer.DomainNames, pp.Child("domainNames"))...)
			}
			addressPeer = addressPeer || peer.Networks != nil || peer.Nodes != nil || peer.DomainNames != nil
			if peer.DomainNames != nil && r.Action != npav1beta1.ClusterNetworkPolicyRuleActionAccept && r.Action != "" {
				errs = append(errs, field.Invalid(pp.Child("domainNames"), r.Action,
					"domainNames peers are allowed only in Accept rules (rule action is "+string(r.Action)+"); deny the rest in a rule after it"))
			}
		}
		errs = append(errs, validateProtocols(r.Protocols, rp.Child("protocols"))...)
		if addressPeer {
			for j, proto := range r.Protocols {
				if proto.DestinationNamedPort != "" {
					errs = append(errs, field.Invalid(rp.Child("protocols").Index(j).Child("destinationNamedPort"), proto.DestinationNamedPort,
						"may not be used in a rule with networks, nodes or domainNames peers, which have no named ports"))
				}
			}
		}
	}
	return errs
}

// validateClusterMeta checks the metadata of a cluster-scoped custom resource: its name is a
// DNS-1123 subdomain, as for every custom resource.
func validateClusterMeta(m *metav1.ObjectMeta) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("metadata")
	if m.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(m.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), m.Name, msg))
		}
	}
	return append(errs, metav1validation.ValidateLabels(m.Labels, p.Child("labels"))...)
}

func countSet(set ...bool) int {
	n := 0
	for _, s := range set {
		if s {
			n++
		}
	}
	return n
}

// atMostOne checks a peer: the CRD wants exactly one field, but a peer with none is kept (see
// ValidateClusterNetworkPolicy).
func atMostOne(p *field.Path, names []string, set ...bool) field.ErrorList {
	if countSet(set...) <= 1 {
		return nil
	}
	var given []string
	for i, s := range set {
		if s {
			given = append(given, names[i])
		}
	}
	return field.ErrorList{field.Invalid(p, strings.Join(given, ", "), "at most one of "+strings.Join(names, ", ")+" may be set")}
}

func validateRuleHead(name string, action npav1beta1.ClusterNetworkPolicyRuleAction, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(name) > cnpMaxRuleName {
		errs = append(errs, field.TooLong(p.Child("name"), "", cnpMaxRuleName))
	}
	switch action {
	case npav1beta1.ClusterNetworkPolicyRuleActionAccept, npav1beta1.ClusterNetworkPolicyRuleActionDeny, npav1beta1.ClusterNetworkPolicyRuleActionPass:
	case "":
		errs = append(errs, field.Required(p.Child("action"), "must be Accept, Deny or Pass"))
	default:
		errs = append(errs, field.NotSupported(p.Child("action"), action, []string{"Accept", "Deny", "Pass"}))
	}
	return errs
}

// validateListSize checks a list of the CRD's with minItems 1 and maxItems 25. An absent list
// (isNil) is an error only when required; a present but empty one always is.
func validateListSize(n int, isNil bool, p *field.Path, required bool) field.ErrorList {
	switch {
	case isNil && required:
		return field.ErrorList{field.Required(p, "must have at least 1 item")}
	case !isNil && n == 0:
		return field.ErrorList{field.Invalid(p, "[]", "must have at least 1 item")}
	case n > cnpMaxItems:
		return field.ErrorList{field.TooMany(p, n, cnpMaxItems)}
	}
	return nil
}

// validateSelector checks that sel, when set, converts to a labels.Selector, which is how the
// compiler will read it. The CRD does not check selectors at all. Each requirement is checked
// alone, so that the error names the one at fault.
func validateSelector(sel *metav1.LabelSelector, p *field.Path) field.ErrorList {
	if sel == nil {
		return nil
	}
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(sel.MatchLabels)) {
		one := &metav1.LabelSelector{MatchLabels: map[string]string{k: sel.MatchLabels[k]}}
		if _, err := metav1.LabelSelectorAsSelector(one); err != nil {
			errs = append(errs, field.Invalid(p.Child("matchLabels").Key(k), sel.MatchLabels[k], err.Error()))
		}
	}
	for i, req := range sel.MatchExpressions {
		one := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{req}}
		if _, err := metav1.LabelSelectorAsSelector(one); err != nil {
			value := fmt.Sprintf("%s %s %v", req.Key, req.Operator, req.Values)
			errs = append(errs, field.Invalid(p.Child("matchExpressions").Index(i), value, err.Error()))
		}
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil && len(errs) == 0 {
		errs = append(errs, field.Invalid(p, sel.String(), err.Error()))
	}
	return errs
}

func validateNamespacedPod(np *npav1beta1.NamespacedPod, p *field.Path) field.ErrorList {
	if np == nil {
		return nil
	}
	errs := validateSelector(&np.NamespaceSelector, p.Child("namespaceSelector"))
	return append(errs, validateSelector(&np.PodSelector, p.Child("podSelector"))...)
}

func validateProtocols(protos []npav1beta1.ClusterNetworkPolicyProtocol, p *field.Path) field.ErrorList {
	errs := validateListSize(len(protos), protos == nil, p, false)
	for i := range protos {
		proto := &protos[i]
		pp := p.Index(i)
		names := []string{"tcp", "udp", "sctp", "destinationNamedPort"}
		switch n := countSet(proto.TCP != nil, proto.UDP != nil, proto.SCTP != nil, proto.DestinationNamedPort != ""); {
		case n == 0:
			errs = append(errs, field.Required(pp, "exactly one of "+strings.Join(names, ", ")+" must be set"))
		case n > 1:
			errs = append(errs, atMostOne(pp, names, proto.TCP != nil, proto.UDP != nil, proto.SCTP != nil, proto.DestinationNamedPort != "")...)
		}
		if proto.TCP != nil {
			errs = append(errs, validatePort(proto.TCP.DestinationPort, pp.Child("tcp", "destinationPort"))...)
		}
		if proto.UDP != nil {
			errs = append(errs, validatePort(proto.UDP.DestinationPort, pp.Child("udp", "destinationPort"))...)
		}
		if proto.SCTP != nil {
			errs = append(errs, validatePort(proto.SCTP.DestinationPort, pp.Child("sctp", "destinationPort"))...)
		}
	}
	return errs
}

// validatePort checks a protocol's destinationPort, which the CRD requires (minProperties 1 on
// tcp, udp and sctp): exactly one of a number or a range.
func validatePort(port *npav1beta1.Port, p *field.Path) field.ErrorList {
	if port == nil {
		return field.ErrorList{field.Required(p, "")}
	}
	var errs field.ErrorList
	switch {
	case port.Number == 0 && port.Range == nil:
		return field.ErrorList{field.Required(p, "exactly one of number or range must be set")}
	case port.Number != 0 && port.Range != nil:
		errs = append(errs, field.Invalid(p, fmt.Sprintf("number %d, range %d-%d", port.Number, port.Range.Start, port.Range.End),
			"exactly one of number or range must be set"))
	}
	if port.Number != 0 && (port.Number < 1 || port.Number > 65535) {
		errs = append(errs, field.Invalid(p.Child("number"), port.Number, "must be between 1 and 65535"))
	}
	if r := port.Range; r != nil {
		rp := p.Child("range")
		okStart, okEnd := r.Start >= 1 && r.Start <= 65535, r.End >= 1 && r.End <= 65535
		if !okStart {
			errs = append(errs, field.Invalid(rp.Child("start"), r.Start, "must be between 1 and 65535"))
		}
		if !okEnd {
			errs = append(errs, field.Invalid(rp.Child("end"), r.End, "must be between 1 and 65535"))
		}
		if okStart && okEnd && r.Start >= r.End {
			errs = append(errs, field.Invalid(rp, fmt.Sprintf("%d-%d", r.Start, r.End), "start port must be less than end port"))
		}
	}
	return errs
}

// validateNetworks checks CIDRs as the CRD's CEL rule `isCIDR(self) && cidr(self) ==
// cidr(self).masked()` does: IPv4 or IPv6 (not IPv4-mapped IPv6), no bits set after the mask.
func validateNetworks(nets []npav1beta1.CIDR, p *field.Path) field.ErrorList {
	errs := validateListSize(len(nets), false, p, false)
	seen := map[npav1beta1.CIDR]bool{}
	for i, c := range nets {
		ip := p.Index(i)
		if seen[c] {
			errs = append(errs, field.Duplicate(ip, c))
		}
		seen[c] = true
		if len(c) > cnpMaxCIDRLength {
			errs = append(errs, field.TooLong(ip, "", cnpMaxCIDRLength))
			continue
		}
		pfx, err := netip.ParsePrefix(string(c))
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(ip, c, "invalid CIDR: must be an IPv4 or IPv6 network such as 10.0.0.0/8 or fd00::/8"))
		case pfx.Addr().Is4In6():
			errs = append(errs, field.Invalid(ip, c, "invalid CIDR: IPv4-mapped IPv6 addresses are not allowed"))
		case pfx.Masked() != pfx:
			errs = append(errs, field.Invalid(ip, c, fmt.Sprintf("invalid CIDR: bits are set after the mask; did you mean %s?", pfx.Masked())))
		}
	}
	return errs
}

func validateDomainNames(names []npav1beta1.DomainName, p *field.Path) field.ErrorList {
	errs := validateListSize(len(names), false, p, false)
	seen := map[npav1beta1.DomainName]bool{}
	for i, d := range names {
		ip := p.Index(i)
		if seen[d] {
			errs = append(errs, field.Duplicate(ip, d))
		}
		seen[d] = true
		if !cnpDomainName.MatchString(string(d)) {
			errs = append(errs, field.Invalid(ip, d, "must be a domain name such as example.com or *.example.com"))
		}
	}
	return errs
}

// InvalidError is an object that failed validation, named with its kind and key, e.g.
//
//	ClusterNetworkPolicy "x": spec.egress[1].to[0].networks[2]: Invalid value: "10.0.0.0/33": invalid CIDR: ...
type InvalidError struct {
	Kind string
	// Key is the object's name, or namespace/name when it is namespaced.
	Key  string
	Errs field.ErrorList
}

func (e *InvalidError) Error() string {
	msgs := make([]string, len(e.Errs))
	for i, fe := range e.Errs {
		msgs[i] = fe.Error()
	}
	return fmt.Sprintf("%s %q: %s", e.Kind, e.Key, strings.Join(msgs, "; "))
}

// ClusterPolicyError returns the problems of a ClusterNetworkPolicy as one error naming it and
// each field (nil when it is valid).
func ClusterPolicyError(cnp *npav1beta1.ClusterNetworkPolicy) error {
	errs := ValidateClusterNetworkPolicy(cnp)
	if len(errs) == 0 {
		return nil
	}
	return &InvalidError{Kind: "ClusterNetworkPolicy", Key: cnp.Name, Errs: errs}
}
