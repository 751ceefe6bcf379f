package policy_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// TestNarrowsKeepsItsPromise drives a Compiler through random changes and, after each one
// for which Narrows says no verdict narrowed, judges every local pod against every pod and
// ipBlock address on the ports the policies name, both ways, with the previous and the new
// Ruleset: nothing the previous allowed may be denied. It also checks that Narrows says no
// often enough to matter, and that it says no for a policy added for isolated pods, the
// change it exists for.
func TestNarrowsKeepsItsPromise(t *testing.T) {
	spec := synth.Spec{Namespaces: 8, Pods: 60, LocalPods: 12, Policies: 40, LocalNode: "node-0", Nodes: 3,
		LocalCIDRv4: synth.Default().LocalCIDRv4, RemoteCIDRv4: synth.Default().RemoteCIDRv4}
	st := synth.Generate(spec)
	cluster.NumberAfter(st, nil)
	r := rand.New(rand.NewPCG(3, 4))
	c := policy.NewCompiler(spec.LocalNode)
	prev, _ := c.Compile(st)
	promises, alarms := 0, 0
	for step := 0; step < 150; step++ {
		next := st.Clone()
		keys := podKeys(next)
		what := ""
		switch r.IntN(6) {
		case 0: // relabel a pod
			k := keys[r.IntN(len(keys))]
			p := clonePod(next.Pods.Get(k))
			p.Labels["app"] = fmt.Sprintf("app-%d", r.IntN(10))
			next.Pods.Set(k, p)
			what = "relabel " + k
		case 1: // delete a pod
			k := keys[r.IntN(len(keys))]
			next.Pods.Set(k, nil)
			what = "delete " + k
		case 2: // delete a policy
			for k := range next.Policies {
				delete(next.Policies, k)
				what = "delete policy " + k
				break
			}
		case 3, 4: // add a policy selecting some pods of a namespace
			for _, np := range next.Policies {
				np = np.DeepCopy()
				np.Name = fmt.Sprintf("new-%d", step)
				if r.IntN(2) == 0 {
					np.Spec.PodSelector = metav1.LabelSelector{}
				}
				next.Policies[cluster.Key(np.Namespace, np.Name)] = np
				what = "add policy " + np.Name
				break
			}
		case 5: // change a policy's peers in place
			for k, np := range next.Policies {
				np = np.DeepCopy()
				np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", r.IntN(10))}}}}}}
				next.Policies[k] = np
				what = "change policy " + k
				break
			}
		}
		cluster.NumberAfter(next, st)
		cur, _ := c.Compile(next)
		if cur.Narrows(prev) {
			alarms++
		} else {
			promises++
			if bad := firstNarrowed(prev, cur, st, next); bad != "" {
				t.Fatalf("step %d (%s): Narrows said no, but %s", step, what, bad)
			}
		}
		st, prev = next, cur
	}
	t.Logf("%d changes could not narrow, %d might have", promises, alarms)
	if promises < 30 || alarms < 30 {
		t.Fatalf("Narrows said no %d times and yes %d times in 150 changes: the test no longer exercises both answers", promises, alarms)
	}

	// A policy added for pods that other policies already isolate only adds allows.
	var ns string
	for _, np := range st.Policies {
		ns = np.Namespace
		break
	}
	added := st.Clone()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-more"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}}}
	added.Policies[cluster.Key(ns, np.Name)] = np
	cluster.NumberAfter(added, st)
	c = policy.NewCompiler(spec.LocalNode)
	before, _ := c.Compile(st)
	after, _ := c.Compile(added)
	if len(after.Dispatch[policy.Ingress]) != len(before.Dispatch[policy.Ingress]) {
		t.Logf("the added policy isolates new pods (%d -> %d isolated for ingress); Narrows must say yes",
			len(before.Dispatch[policy.Ingress]), len(after.Dispatch[policy.Ingress]))
		if !after.Narrows(before) {
			t.Fatal("a policy isolating new pods does not narrow")
		}
		return
	}
	if after.Narrows(before) {
		t.Fatal("a policy that only admits more pods to already isolated ones narrows")
	}
}

// firstNarrowed returns a verdict that cur denies and prev allowed, or "".
func firstNarrowed(prev, cur *policy.Ruleset, states ...*cluster.State) string {
	var peers []netip.Addr
	for _, st := range states {
		for _, p := range st.Pods.All() {
			peers = append(peers, policy.EligibleIPs(p)...)
		}
	}
	for _, rs := range []*policy.Ruleset{prev, cur} {
		for _, s := range rs.CIDRSets {
			for _, p := range s.Prefixes {
				peers = append(peers, p.Addr(), p.Addr().Next())
			}
		}
	}
	peers = append(peers, netip.MustParseAddr("203.0.113.9"))
	locals := map[netip.Addr]bool{}
	for _, rs := range []*policy.Ruleset{prev, cur} {
		for _, d := range rs.Dispatch {
			for a := range d {
				locals[a] = true
			}
		}
	}
	type port struct {
		proto policy.Protocol
		n     uint16
	}
	ports := []port{{policy.TCP, 80}, {policy.TCP, 5432}, {policy.TCP, 8050}, {policy.TCP, 9001}, {policy.UDP, 53}, {policy.UDP, 9007}}
	for local := range locals {
		for _, peer := range peers {
			for _, p := range ports {
				for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
					if prev.Judge(dir, local, peer, p.proto, p.n).Allowed && !cur.Judge(dir, local, peer, p.proto, p.n).Allowed {
						return fmt.Sprintf("%s of %s with %s %s/%d was allowed and is now denied", dir, local, peer, p.proto, p.n)
					}
				}
			}
		}
	}
	return ""
}
