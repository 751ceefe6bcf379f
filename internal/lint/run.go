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
	rs, judged, standIns := compileAll(st)
	checkDNS(r, v, rs, judged, standIns, opts)
	checkBackends(r, rs)
	r.sort()
	return r
}

// compileAll compiles st with every pod local to one node, at a stand-in address when it has
// none yet, so that every pod's verdicts can be asked; it returns the state it compiled too, and
// the pods judged at stand-in addresses.
func compileAll(st *cluster.State) (*policy.Ruleset, *cluster.State, map[string][]netip.Addr) {
	st, standIns := policy.WithStandIns(st, lintNode)
	local := *st
	local.Pods = &cluster.PodMap{}
	local.Changes = nil
	for k, p := range st.Pods.All() {
		cp := *p
		cp.NodeName = lintNode
		local.Pods.Set(k, &cp)
	}
	rs, _ := policy.Compile(&local, lintNode)
	return rs, &local, standIns
}

// checkDNS finds pods isolated for egress (or denied by a ClusterNetworkPolicy) that cannot
// reach the cluster DNS pods on their DNS port (judged after DNAT, as the kernel does) over
// UDP in any family they share: "default-deny egress broke DNS". Where a pod or the DNS is
// judged at a stand-in address and a rule naming addresses takes part, the verdict depends on
// the addresses they get: a warning, not an error.
func checkDNS(r *Report, v *view, rs *policy.Ruleset, judged *cluster.State, standIns map[string][]netip.Addr, opts Options) {
	var dns []*cluster.Pod
	for _, p := range v.pods {
		if p.Namespace == opts.DNSNamespace && labels.SelectorFromSet(opts.DNSLabels).Matches(labels.Set(p.Labels)) {
			dns = append(dns, p)
		}
	}
	if len(dns) == 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("no cluster DNS pods (namespace %s, labels %s, not host network): the check of egress to DNS did not run",
			opts.DNSNamespace, labels.SelectorFromSet(opts.DNSLabels)))
		return
	}
	denied := map[cause][]string{}
	var order []cause
	keyOf := func(p *cluster.Pod) string { return cluster.Key(p.Namespace, p.Name) }
	addrOf := func(p *cluster.Pod) []netip.Addr { return policy.EligibleIPs(judged.Pods.Get(keyOf(p))) }
	for _, p := range v.pods {
		if slices.Contains(dns, p) {
			continue
		}
		reached, judgedAny := false, false
		var why cause
		for _, src := range addrOf(p) {
			for _, d := range dns {
				for _, dst := range addrOf(d) {
					if dst.Is4() != src.Is4() {
						continue
					}
					judgedAny = true
					j := rs.Judge(policy.Egress, src, dst, policy.UDP, dnsPort(d))
					if j.Allowed {
						reached = true
						continue
					}
					why.blame = dnsCause(j, opts)
					if (standIns[keyOf(p)] != nil || standIns[keyOf(d)] != nil) && len(rs.AddressRules(policy.Egress, src)) > 0 {
						why.dependsOnAddress = true
					}
				}
			}
		}
		if judgedAny && !reached && why.blame.obj != "" {
			if _, ok := denied[why]; !ok {
				order = append(order, why)
			}
			denied[why] = append(denied[why], keyOf(p))
		}
	}
	for _, c := range order {
		pods := denied[c]
		list := strings.Join(pods, ", ")
		if len(pods) > 5 {
			list = strings.Join(pods[:5], ", ") + fmt.Sprintf(" and %d more", len(pods)-5)
		}
		f := Finding{Severity: Error, Check: "dns-egress", Object: c.blame.obj, Field: c.blame.field,
			Problem: fmt.Sprintf("pods %s cannot reach the cluster DNS (%s) on UDP port %d", list, keyOf(dns[0]), dnsPort(dns[0])),
			Why:     "every name lookup of these pods fails, so nearly every connection they make fails before it starts",
			Fix:     c.blame.fix}
		if c.dependsOnAddress {
			f.Severity = Warning
			f.Problem += ", judged at stand-in addresses (they have none yet) while rules naming addresses (ipBlock, networks) take part: it depends on the addresses they get"
		}
		r.add(f)
	}
}

// dnsPort is the port a DNS pod serves on over UDP: the container port named dns, else 53.
// Egress is judged after DNAT, so the Service's port 53 reaches the pod on this one.
func dnsPort(p *cluster.Pod) uint16 {
	for _, cp := range p.Ports {
		if cp.Name == "dns" && cp.Protocol == corev1.ProtocolUDP {
			return uint16(cp.Port)
		}
	}
	return 53
}

// dnsBlame is the policy whose verdict denied DNS, and what to change in it.
type dnsBlame struct{ obj, field, fix string }

// cause is why pods cannot reach DNS: whom to blame, and whether it rests on stand-in addresses.
type cause struct {
	blame            dnsBlame
	dependsOnAddress bool
}

// dnsCause names the policy whose verdict denied DNS and what to change in it.
func dnsCause(j policy.Judgement, opts Options) (c dnsBlame) {
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
