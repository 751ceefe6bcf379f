// Package synth generates synthetic clusters at a chosen scale for benchmarks: many
// namespaces, pods spread over many nodes (a few on the node under test), and policies with a
// realistic mix of selectors, ipBlocks and ports.
package synth

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Spec sizes a synthetic cluster.
type Spec struct {
	Namespaces int
	Pods       int // spread evenly over namespaces
	LocalPods  int // how many of them run on LocalNode, one per namespace first
	Policies   int // spread evenly over namespaces
	// ClusterPolicies is how many ClusterNetworkPolicies to add, half in each tier.
	ClusterPolicies int
	LocalNode       string
	Nodes           int // nodes sharing the non-local pods
	DualStack       bool
	LocalIPs        []netip.Addr // IPv4 addresses for local pods, taken in order (optional)
	LocalIPv6s      []netip.Addr
	LocalCIDRv4     netip.Prefix // where generated local pod IPs come from
	RemoteCIDRv4    netip.Prefix
}

// Default is the benchmark scale of the NetworkPolicy issue: 5,000 pods, 110 of them on this
// node, 1,000 namespaces and 10,000 policies.
func Default() Spec {
	return Spec{Namespaces: 1000, Pods: 5000, LocalPods: 110, Policies: 10000, LocalNode: "node-0", Nodes: 50,
		LocalCIDRv4: netip.MustParsePrefix("10.244.0.0/24"), RemoteCIDRv4: netip.MustParsePrefix("10.128.0.0/10")}
}

// Scale multiplies namespaces, pods and policies, keeping the local pod count (a node holds
// at most 110 pods whatever the cluster size).
func (s Spec) Scale(k int) Spec {
	s.Namespaces *= k
	s.Pods *= k
	s.Policies *= k
	s.Nodes *= k
	return s
}

func nsName(i int) string { return fmt.Sprintf("ns-%05d", i) }

// Generate builds the cluster. Pod i lives in namespace i % Namespaces; the first LocalPods
// pods are local, so they fall in distinct namespaces.
func Generate(s Spec) *cluster.State {
	st := cluster.NewState()
	envs := []string{"prod", "staging", "dev"}
	for i := 0; i < s.Namespaces; i++ {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{
			"team": fmt.Sprintf("team-%d", i%40), "env": envs[i%3],
		}}}
		cluster.DefaultNamespace(ns)
		st.Namespaces[ns.Name] = ns
	}
	remote := s.RemoteCIDRv4.Addr()
	local := s.LocalCIDRv4.Addr().Next().Next()
	for i := 0; i < s.Pods; i++ {
		ns := nsName(i % s.Namespaces)
		node := fmt.Sprintf("node-%d", 1+i%max(s.Nodes-1, 1))
		var ip4, ip6 netip.Addr
		if i < s.LocalPods {
			node = s.LocalNode
			if i < len(s.LocalIPs) {
				ip4 = s.LocalIPs[i]
			} else {
				ip4, local = local, local.Next()
			}
			if i < len(s.LocalIPv6s) {
				ip6 = s.LocalIPv6s[i]
			}
		} else {
			ip4, remote = remote, remote.Next()
		}
		if s.DualStack && !ip6.IsValid() {
			b := ip4.As4()
			ip6 = netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, b[0], b[1], b[2], b[3]})
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%06d", i), Labels: map[string]string{
				"app": fmt.Sprintf("app-%d", (i/s.Namespaces)%10), "tier": []string{"web", "api", "db"}[i%3],
			}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP},
				{Name: "metrics", ContainerPort: int32(9000 + i%3), Protocol: corev1.ProtocolTCP},
			}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip4.String()}}},
		}
		if ip6.IsValid() {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip6.String()})
		}
		st.Pods.Set(cluster.Key(ns, p.Name), cluster.PodOf(p))
	}
	for i := 0; i < s.Policies; i++ {
		np := policy(i, s.Namespaces)
		cluster.DefaultNetworkPolicy(np)
		st.Policies[cluster.Key(np.Namespace, np.Name)] = np
	}
	for i := 0; i < s.ClusterPolicies; i++ {
		cnp := ClusterPolicy(i)
		st.ClusterPolicies[cnp.Name] = cnp
	}
	return st
}

// ClusterPolicy returns ClusterNetworkPolicy i of the synthetic cluster. Tiers alternate; most
// select the pods of one app in the namespaces of one team (a few policies per pod), and two
// in a hundred (one per tier) select every namespace, as cluster-wide guard rails do. Rule shapes cycle
// through every action, peer kind and port kind; none matches the connection-rate
// benchmark's flow (TCP 80 between two pods), which is left to NetworkPolicy.
func ClusterPolicy(i int) *npav1beta1.ClusterNetworkPolicy {
	cnp := &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp-%05d", i)}}
	cnp.Spec.Tier = npav1beta1.AdminTier
	if i%2 == 1 {
		cnp.Spec.Tier = npav1beta1.BaselineTier
	}
	cnp.Spec.Priority = int32(i * 7 % 1001)
	labels := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	if i%100 == 2 || i%100 == 3 {
		cnp.Spec.Subject.Namespaces = &metav1.LabelSelector{}
	} else {
		cnp.Spec.Subject.Pods = &npav1beta1.NamespacedPod{
			NamespaceSelector: *labels("team", fmt.Sprintf("team-%d", i/2%40)),
			PodSelector:       *labels("app", fmt.Sprintf("app-%d", i/80%10)),
		}
	}
	tcp := func(p int32) []npav1beta1.ClusterNetworkPolicyProtocol {
		return []npav1beta1.ClusterNetworkPolicyProtocol{{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: p}}}}
	}
	in := func(a npav1beta1.ClusterNetworkPolicyRuleAction, peer npav1beta1.ClusterNetworkPolicyIngressPeer, protos []npav1beta1.ClusterNetworkPolicyProtocol) {
		cnp.Spec.Ingress = append(cnp.Spec.Ingress, npav1beta1.ClusterNetworkPolicyIngressRule{Action: a,
			From: []npav1beta1.ClusterNetworkPolicyIngressPeer{peer}, Protocols: protos})
	}
	out := func(a npav1beta1.ClusterNetworkPolicyRuleAction, peer npav1beta1.ClusterNetworkPolicyEgressPeer, protos []npav1beta1.ClusterNetworkPolicyProtocol) {
		cnp.Spec.Egress = append(cnp.Spec.Egress, npav1beta1.ClusterNetworkPolicyEgressRule{Action: a,
			To: []npav1beta1.ClusterNetworkPolicyEgressPeer{peer}, Protocols: protos})
	}
	switch i / 2 % 6 {
	case 0:
		in(npav1beta1.ClusterNetworkPolicyRuleActionDeny, npav1beta1.ClusterNetworkPolicyIngressPeer{Namespaces: labels("env", "dev")}, tcp(22))
	case 1:
		in(npav1beta1.ClusterNetworkPolicyRuleActionPass, npav1beta1.ClusterNetworkPolicyIngressPeer{Pods: &npav1beta1.NamespacedPod{
			NamespaceSelector: *labels("team", fmt.Sprintf("team-%d", i/2%40)), PodSelector: *labels("tier", "api")}}, tcp(5432))
	case 2:
		out(npav1beta1.ClusterNetworkPolicyRuleActionAccept, npav1beta1.ClusterNetworkPolicyEgressPeer{Networks: []npav1beta1.CIDR{"10.0.0.0/8"}}, tcp(443))
	case 3:
		out(npav1beta1.ClusterNetworkPolicyRuleActionDeny, npav1beta1.ClusterNetworkPolicyEgressPeer{Networks: []npav1beta1.CIDR{"192.0.2.0/24", "2001:db8::/32"}}, nil)
	case 4:
		out(npav1beta1.ClusterNetworkPolicyRuleActionPass, npav1beta1.ClusterNetworkPolicyEgressPeer{Namespaces: labels(cluster.NamespaceNameLabel, "kube-system")},
			[]npav1beta1.ClusterNetworkPolicyProtocol{{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1beta1.Port{Number: 53}}}})
	default:
		in(npav1beta1.ClusterNetworkPolicyRuleActionAccept, npav1beta1.ClusterNetworkPolicyIngressPeer{Namespaces: labels(cluster.NamespaceNameLabel, "monitoring")},
			[]npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "metrics"}})
	}
	return cnp
}

// policy i lives in namespace i % namespaces; its kind cycles through common shapes so the
// mix has default-deny, same-namespace, cross-namespace, ipBlock, named-port and egress rules.
func policy(i, namespaces int) *networkingv1.NetworkPolicy {
	ns := nsName(i % namespaces)
	kind := (i / namespaces) % 10
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("np-%06d", i)}}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p int) *intstr.IntOrString { v := intstr.FromInt32(int32(p)); return &v }
	named := func(n string) *intstr.IntOrString { v := intstr.FromString(n); return &v }
	app := func(k int) map[string]string { return map[string]string{"app": fmt.Sprintf("app-%d", k%10)} }
	team := func(k int) map[string]string { return map[string]string{"team": fmt.Sprintf("team-%d", k%40)} }
	switch kind {
	case 0:
		np.Spec.PodSelector = metav1.LabelSelector{}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case 1:
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(5432)}},
		}}
	case 2:
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: team(i)}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: named("http")},
				{Protocol: &tcp, Port: port(8000), EndPort: ptr(int32(8100))}},
		}}
	case 3:
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: app(i)}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: team(i + 7)},
				PodSelector:       &metav1.LabelSelector{MatchLabels: app(i + 3)},
			}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(80)}},
		}}
	case 4:
		np.Spec.PodSelector = metav1.LabelSelector{}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
				CIDR: fmt.Sprintf("172.%d.0.0/16", 16+i%16), Except: []string{fmt.Sprintf("172.%d.%d.0/24", 16+i%16, i%256)},
			}}},
		}}
	case 5:
		np.Spec.PodSelector = metav1.LabelSelector{}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}},
			}, {
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "staging"}}}},
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "prometheus"}},
			}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: named("metrics")}},
		}}
	case 6:
		np.Spec.PodSelector = metav1.LabelSelector{}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
			}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: port(53)}, {Protocol: &tcp, Port: port(53)}},
		}, {
			To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
		}}
	case 7:
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}}},
		}}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("10.%d.0.0/16", i%64)}}},
		}}
	case 8:
		np.Spec.PodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{fmt.Sprintf("app-%d", i%10)}}}}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: app(i + 1)}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: port(9000 + i%100)}},
		}}
	default:
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: app(i)}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}},
		}}
	}
	return np
}

func ptr[T any](v T) *T { return &v }

// WriteObjectFiles writes st into dir as one YAML manifest per object (about 16,000 files for
// Default), the layout of a directory a tool keeps in step with a cluster object by object, and
// returns how many it wrote.
func WriteObjectFiles(dir string, st *cluster.State) (int, error) {
	n := 0
	write := func(name string, obj any) error {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		n++
		return os.WriteFile(filepath.Join(dir, name), data, 0o644)
	}
	for name, ns := range st.Namespaces {
		ns = ns.DeepCopy()
		ns.APIVersion, ns.Kind = "v1", "Namespace"
		if err := write("ns-"+name+".yaml", ns); err != nil {
			return n, err
		}
	}
	for _, pod := range st.Pods.All() {
		p := pod.APIObject()
		if err := write(fmt.Sprintf("pod-%s-%s.yaml", p.Namespace, p.Name), p); err != nil {
			return n, err
		}
	}
	for _, np := range st.Policies {
		np = np.DeepCopy()
		np.APIVersion, np.Kind = "networking.k8s.io/v1", "NetworkPolicy"
		if err := write(fmt.Sprintf("np-%s-%s.yaml", np.Namespace, np.Name), np); err != nil {
			return n, err
		}
	}
	for name, node := range st.Nodes {
		node = node.DeepCopy()
		node.APIVersion, node.Kind = "v1", "Node"
		if err := write("node-"+name+".yaml", node); err != nil {
			return n, err
		}
	}
	for name, cnp := range st.ClusterPolicies {
		cnp = cnp.DeepCopy()
		cnp.APIVersion, cnp.Kind = npav1beta1.GroupVersion.String(), "ClusterNetworkPolicy"
		if err := write("cnp-"+name+".yaml", cnp); err != nil {
			return n, err
		}
	}
	return n, nil
}
