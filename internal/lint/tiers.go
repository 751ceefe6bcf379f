package lint

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// cnpRule is one rule of a ClusterNetworkPolicy, in the shape the checks compare.
type cnpRule struct {
	field   string
	name    string
	action  npav1beta1.ClusterNetworkPolicyRuleAction
	peers   []any // the rule's ingress or egress peers
	allPods bool  // a peer matches every pod (namespaces: {})
	// failClosed: a peer the agent cannot match by its fields (none it knows is set: a newer
	// API's peer) matches nothing in an Accept rule and everything in a Deny or Pass rule
	// (policy.compileClusterRule), so no rule covers it, and it covers only as that. A
	// domainNames peer (Accept only) is treated alike: it admits addresses learned from DNS
	// answers, which no check here can know, and never a pod by its labels.
	failClosed bool
	protocols  []npav1beta1.ClusterNetworkPolicyProtocol
}

func cnpRules(cnp *npav1beta1.ClusterNetworkPolicy, egress bool) []cnpRule {
	var out []cnpRule
	if !egress {
		for i, r := range cnp.Spec.Ingress {
			cr := cnpRule{field: fmt.Sprintf("spec.ingress[%d]", i), name: r.Name, action: r.Action, protocols: r.Protocols}
			for _, p := range r.From {
				cr.peers = append(cr.peers, p)
				cr.allPods = cr.allPods || p.Namespaces != nil && isEmpty(p.Namespaces)
				cr.failClosed = cr.failClosed || p.Namespaces == nil && p.Pods == nil
			}
			out = append(out, cr)
		}
		return out
	}
	for i, r := range cnp.Spec.Egress {
		cr := cnpRule{field: fmt.Sprintf("spec.egress[%d]", i), name: r.Name, action: r.Action, protocols: r.Protocols}
		for _, p := range r.To {
			cr.peers = append(cr.peers, p)
			cr.allPods = cr.allPods || p.Namespaces != nil && isEmpty(p.Namespaces)
			cr.failClosed = cr.failClosed || p.Namespaces == nil && p.Pods == nil && p.Nodes == nil && len(p.Networks) == 0
		}
		out = append(out, cr)
	}
	return out
}

func isEmpty(ls *metav1.LabelSelector) bool {
	return len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0
}

// covers reports whether every connection rule b matches, rule a matches too: then a, checked
// first, decides them all and b is never reached.
func covers(a, b cnpRule) bool {
	if a.failClosed || b.failClosed {
		return false // what such a peer matches depends on the action: leave it to the agent's log
	}
	if len(a.protocols) > 0 && len(b.protocols) == 0 {
		return false // a limits the ports and b takes all of them
	}
	for _, bp := range b.protocols {
		if len(a.protocols) > 0 && !slices.ContainsFunc(a.protocols, func(ap npav1beta1.ClusterNetworkPolicyProtocol) bool { return reflect.DeepEqual(ap, bp) }) {
			return false
		}
	}
	for _, peer := range b.peers {
		if slices.ContainsFunc(a.peers, func(ap any) bool { return reflect.DeepEqual(ap, peer) }) {
			continue
		}
		if a.allPods && isPodPeer(peer) {
			continue
		}
		return false
	}
	return len(b.peers) > 0
}

// isPodPeer reports whether a peer selects pods (namespaces or pods), not nodes or networks.
func isPodPeer(p any) bool {
	switch p := p.(type) {
	case npav1beta1.ClusterNetworkPolicyIngressPeer:
		return p.Namespaces != nil || p.Pods != nil
	case npav1beta1.ClusterNetworkPolicyEgressPeer:
		return p.Namespaces != nil || p.Pods != nil
	}
	return false
}

func subjectCovers(a, b npav1beta1.ClusterNetworkPolicySubject) bool {
	return a.Namespaces != nil && isEmpty(a.Namespaces) || reflect.DeepEqual(a, b)
}

func ruleName(r cnpRule) string {
	if r.name != "" {
		return fmt.Sprintf("%s (%q)", r.field, r.name)
	}
	return r.field
}

// checkClusterPolicies finds, in the ClusterNetworkPolicies, subjects and peers that match
// nothing today, named ports no pod has, rules never reached, Deny rules over the nodes'
// addresses, and priorities that collide.
func checkClusterPolicies(r *Report, v *view) {
	names := sortedKeys(v.st.ClusterPolicies)
	subjects := map[string][]*cluster.Pod{}
	for _, name := range names {
		cnp := v.st.ClusterPolicies[name]
		obj := "ClusterNetworkPolicy " + name
		subj := v.subjectPods(cnp.Spec.Subject)
		subjects[name] = subj
		if len(subj) == 0 {
			r.add(Finding{Severity: Warning, Check: "selects-nothing", Object: obj, Field: "spec.subject",
				Problem: "selects no pod today",
				Why:     "a label typo is the usual cause: the policy then applies to nothing",
				Fix:     "match the labels of the namespaces or pods it is meant for"})
		}
		for _, egress := range []bool{false, true} {
			rules := cnpRules(cnp, egress)
			for j, rule := range rules {
				checkCNPPeers(r, v, obj, rule, egress, subj)
				for i := range j {
					if covers(rules[i], rule) {
						r.add(Finding{Severity: Warning, Check: "unreachable-rule", Object: obj, Field: ruleName(rule),
							Problem: "is never reached: " + ruleName(rules[i]) + " before it matches every connection it matches",
							Why:     "rules are checked in order and the first match decides: this rule's " + strings.ToLower(string(rule.action)) + " never applies",
							Fix:     "move it before " + rules[i].field + ", or narrow that rule"})
						break
					}
				}
			}
		}
	}
	// Across policies of a tier: an earlier policy (lower priority value) whose subject covers a
	// later one's decides first.
	for _, a := range names {
		pa := v.st.ClusterPolicies[a]
		for _, b := range names {
			pb := v.st.ClusterPolicies[b]
			if a == b || pa.Spec.Tier != pb.Spec.Tier {
				continue
			}
			shareDirection := len(pa.Spec.Ingress) > 0 && len(pb.Spec.Ingress) > 0 || len(pa.Spec.Egress) > 0 && len(pb.Spec.Egress) > 0
			if pa.Spec.Priority == pb.Spec.Priority && a < b && shareDirection && overlap(subjects[a], subjects[b]) {
				r.add(Finding{Severity: Warning, Check: "priority-collision", Object: "ClusterNetworkPolicy " + b, Field: "spec.priority",
					Problem: fmt.Sprintf("has priority %d in the %s tier, as ClusterNetworkPolicy %s has, and they select the same pods", pb.Spec.Priority, pb.Spec.Tier, a),
					Why:     "between two policies of one priority the order is not defined: which one decides a connection both match may differ between implementations and nodes",
					Fix:     "give the two policies different priorities"})
			}
			if pa.Spec.Priority >= pb.Spec.Priority || !subjectCovers(pa.Spec.Subject, pb.Spec.Subject) {
				continue
			}
			for _, egress := range []bool{false, true} {
				earlier := cnpRules(pa, egress)
				for _, rule := range cnpRules(pb, egress) {
					for _, e := range earlier {
						if covers(e, rule) {
							r.add(Finding{Severity: Warning, Check: "unreachable-rule", Object: "ClusterNetworkPolicy " + b, Field: ruleName(rule),
								Problem: fmt.Sprintf("is never reached: ClusterNetworkPolicy %s (priority %d, same tier, a subject covering this one's) matches first with %s", a, pa.Spec.Priority, ruleName(e)),
								Why:     "policies of a tier are checked by priority and the first matching rule decides",
								Fix:     fmt.Sprintf("give this policy a priority below %d, or narrow that rule", pa.Spec.Priority)})
							break
						}
					}
				}
			}
		}
	}
}

func overlap(a, b []*cluster.Pod) bool {
	return slices.ContainsFunc(a, func(p *cluster.Pod) bool { return slices.Contains(b, p) })
}

// checkCNPPeers checks one rule's peers: pods and nodes selected, named ports, and Deny rules
// over the nodes' addresses.
func checkCNPPeers(r *Report, v *view, obj string, rule cnpRule, egress bool, subj []*cluster.Pod) {
	var peerPods []*cluster.Pod
	peersField := "from"
	if egress {
		peersField = "to"
	}
	for k, p := range rule.peers {
		f := fmt.Sprintf("%s.%s[%d]", rule.field, peersField, k)
		var pods []*cluster.Pod
		var selectsPods bool
		switch p := p.(type) {
		case npav1beta1.ClusterNetworkPolicyIngressPeer:
			pods, selectsPods = v.cnpPeerPods(p.Namespaces, p.Pods), p.Namespaces != nil || p.Pods != nil
		case npav1beta1.ClusterNetworkPolicyEgressPeer:
			if p.Namespaces != nil || p.Pods != nil {
				pods, selectsPods = v.cnpPeerPods(p.Namespaces, p.Pods), true
			}
			if p.Nodes != nil {
				nodes := v.nodes(p.Nodes)
				if len(nodes) == 0 {
					r.add(Finding{Severity: Warning, Check: "selects-nothing", Object: obj, Field: f + ".nodes",
						Problem: "matches no node today", Why: "a label typo in a peer makes the rule match nothing",
						Fix: "match the labels of the nodes it is meant for (kubectl get nodes --show-labels)"})
				} else if rule.action == npav1beta1.ClusterNetworkPolicyRuleActionDeny {
					nodeDeny(r, obj, f+".nodes", nodes)
				}
			}
			if len(p.Networks) > 0 && rule.action == npav1beta1.ClusterNetworkPolicyRuleActionDeny {
				if nodes := v.nodesIn(p.Networks); len(nodes) > 0 {
					nodeDeny(r, obj, f+".networks", nodes)
				}
			}
		}
		if selectsPods && len(pods) == 0 {
			r.add(Finding{Severity: Warning, Check: "selects-nothing", Object: obj, Field: f,
				Problem: "matches no pod today", Why: "a label typo in a peer makes the rule match nothing",
				Fix: "match the labels of the namespaces or pods it is meant for"})
		}
		peerPods = append(peerPods, pods...)
	}
	ports := peerPods // egress: the named port is the peer's
	whose := "the pods this rule names"
	if !egress {
		ports, whose = subj, "the policy's subject pods"
	}
	for k, proto := range rule.protocols {
		if proto.DestinationNamedPort != "" && !hasNamedPort(ports, proto.DestinationNamedPort, "") {
			r.add(Finding{Severity: Warning, Check: "named-port", Object: obj, Field: fmt.Sprintf("%s.protocols[%d]", rule.field, k),
				Problem: fmt.Sprintf("names port %q, which none of %s has", proto.DestinationNamedPort, whose),
				Why:     "a named port matches only containers that declare it: this rule matches nothing today",
				Fix:     "use the name a container port of those pods has, or the port number"})
		}
	}
}

func nodeDeny(r *Report, obj, field string, nodes []string) {
	r.add(Finding{Severity: Warning, Check: "deny-nodes", Object: obj, Field: field,
		Problem: "denies traffic to the addresses of node(s) " + strings.Join(nodes, ", "),
		Why:     "the pods it applies to lose what runs on those nodes' addresses: host-network pods, node-local DNS caches, the kubelet's and the API server's ports",
		Fix:     "except the node addresses (a narrower networks list, or an earlier Accept for what the pods need there)"})
}

// nodesIn lists the nodes one of whose addresses lies in one of networks.
func (v *view) nodesIn(networks []npav1beta1.CIDR) []string {
	var out []string
	for _, name := range sortedKeys(v.st.Nodes) {
		for _, a := range v.st.Nodes[name].Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				continue
			}
			if slices.ContainsFunc(networks, func(c npav1beta1.CIDR) bool {
				p, err := netip.ParsePrefix(string(c))
				return err == nil && p.Contains(ip)
			}) && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}
