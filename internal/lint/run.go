package lint

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
)

// Options says where the cluster DNS is.
type Options struct {
	// DNSNamespace and DNSLabels select the cluster DNS pods (kube-system, k8s-app=kube-dns:
	// what CoreDNS and kube-dns deployments carry).
	DNSNamespace string
	DNSLabels    map[string]string
}

// DefaultOptions are the cluster DNS of kubeadm, kind and most distributions.
var DefaultOptions = Options{DNSNamespace: "kube-system", DNSLabels: map[string]string{"k8s-app": "kube-dns"}}

// lintNode is the node every pod is judged at: a pod's verdicts do not depend on its node.
const lintNode = "(lint)"

// Run lints st.
func Run(st *cluster.State, opts Options) *Report {
	r := &Report{}
	v := newView(st)
	checkNetworkPolicies(r, v)
	checkClusterPolicies(r, v)
	rs, judged := compileAll(st)
	checkDNS(r, v, rs, judged, opts)
	checkBackends(r, rs)
	r.sort()
	return r
}

// compileAll compiles st with every pod local to one node, at a stand-in address when it has
// none yet, so that every pod's verdicts can be asked; it returns the state it compiled too.
func compileAll(st *cluster.State) (*policy.Ruleset, *cluster.State) {
	st, _ = policy.WithStandIns(st, lintNode)
	local := *st
	local.Pods = make(map[string]*corev1.Pod, len(st.Pods))
	local.Changes = nil
	for k, p := range st.Pods {
		cp := *p
		cp.Spec.NodeName = lintNode
		local.Pods[k] = &cp
	}
	rs, _ := policy.Compile(&local, lintNode)
	return rs, &local
}

// checkDNS finds pods isolated for egress (or denied by a ClusterNetworkPolicy) that cannot
// reach the cluster DNS pods on UDP port 53: "default-deny egress broke DNS".
func checkDNS(r *Report, v *view, rs *policy.Ruleset, judged *cluster.State, opts Options) {
	var dns []*corev1.Pod
	for _, p := range v.pods {
		if p.Namespace == opts.DNSNamespace && labels.SelectorFromSet(opts.DNSLabels).Matches(labels.Set(p.Labels)) {
			dns = append(dns, p)
		}
	}
	if len(dns) == 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("no cluster DNS pods (namespace %s, labels %s): the check of egress to DNS did not run",
			opts.DNSNamespace, labels.SelectorFromSet(opts.DNSLabels)))
		return
	}
	type cause struct{ obj, field, fix string }
	denied := map[cause][]string{}
	var order []cause
	addrOf := func(p *corev1.Pod) []netip.Addr { return eligible(judged.Pods[cluster.Key(p.Namespace, p.Name)]) }
	for _, p := range v.pods {
		if slices.Contains(dns, p) {
			continue
		}
		for _, src := range addrOf(p) {
			reached := false
			var why cause
			for _, d := range dns {
				for _, dst := range addrOf(d) {
					if dst.Is4() != src.Is4() {
						continue
					}
					j := rs.Judge(policy.Egress, src, dst, policy.UDP, 53)
					if j.Allowed {
						reached = true
						break
					}
					why = dnsCause(j, opts)
				}
				if reached {
					break
				}
			}
			if !reached && why.obj != "" {
				c := cause{why.obj, why.field, why.fix}
				if _, ok := denied[c]; !ok {
					order = append(order, c)
				}
				if k := cluster.Key(p.Namespace, p.Name); !slices.Contains(denied[c], k) {
					denied[c] = append(denied[c], k)
				}
			}
		}
	}
	for _, c := range order {
		pods := denied[c]
		list := strings.Join(pods, ", ")
		if len(pods) > 5 {
			list = strings.Join(pods[:5], ", ") + fmt.Sprintf(" and %d more", len(pods)-5)
		}
		r.add(Finding{Severity: Error, Check: "dns-egress", Object: c.obj, Field: c.field,
			Problem: fmt.Sprintf("pods %s cannot reach the cluster DNS (%s) on UDP port 53", list, keys(dns)[0]),
			Why:     "every name lookup of these pods fails, so nearly every connection they make fails before it starts",
			Fix:     c.fix})
	}
}

// dnsCause names the policy whose verdict denied DNS and what to change in it.
func dnsCause(j policy.Judgement, opts Options) (c struct{ obj, field, fix string }) {
	peer := fmt.Sprintf("namespaceSelector {%s: %s}, podSelector %s", cluster.NamespaceNameLabel, opts.DNSNamespace, labels.SelectorFromSet(opts.DNSLabels))
	switch {
	case j.Admin != nil && j.Admin.Action == policy.Deny:
		c.obj, c.field = "ClusterNetworkPolicy "+j.Admin.Policy, fmt.Sprintf("spec.egress[%d]", j.Admin.Rule)
		c.fix = "add an Accept rule for the DNS pods on UDP and TCP port 53 before this Deny rule"
	case j.Isolated:
		c.obj = "NetworkPolicy " + strings.Join(j.Selecting, ", NetworkPolicy ")
		c.field = "spec.egress"
		c.fix = "add an egress rule to " + peer + " on UDP and TCP port 53 (to one policy selecting these pods, or a policy of its own)"
	case j.Baseline != nil && j.Baseline.Action == policy.Deny:
		c.obj, c.field = "ClusterNetworkPolicy "+j.Baseline.Policy, fmt.Sprintf("spec.egress[%d]", j.Baseline.Rule)
		c.fix = "add an Accept rule for the DNS pods on UDP and TCP port 53 before this Deny rule, or allow DNS in a NetworkPolicy"
	}
	return c
}

// checkBackends finds the policies a backend would skip: applied fail-closed, they isolate their
// pods and admit nothing.
func checkBackends(r *Report, rs *policy.Ruleset) {
	for _, b := range []struct {
		name    string
		skipped []policy.SkippedPolicy
	}{{"nftables", nftables.Render(rs).Skipped}, {"iptables", iptables.Render(rs).Skipped}} {
		for _, s := range b.skipped {
			r.add(Finding{Severity: Error, Check: "backend-skips", Object: "NetworkPolicy " + s.Policy,
				Problem: "the " + b.name + " backend cannot express it: " + s.Reason,
				Why:     "the agent applies it fail-closed: its pods stay isolated and it admits nothing",
				Fix:     "split it into smaller policies, or use the other backend"})
		}
	}
}
