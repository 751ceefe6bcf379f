package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/iptables"
	"github.com/netwarden/netwarden/internal/kernel/xtables"
	"github.com/netwarden/netwarden/internal/nftables"
	"github.com/netwarden/netwarden/internal/policy"
)

func explainCmd() *cobra.Command {
	var f stateFlags
	var from, to, port string
	var kernel, staged bool
	cmd := &cobra.Command{
		Use:   "explain --from NS/POD|IP|FILE --to NS/POD|IP|FILE --port PORT/PROTO",
		Short: "Explain the NetworkPolicy verdict of a connection: each direction, and the objects that decide it",
		Long: `Explain judges a connection with the same policy model the agent programs into the kernel:
egress at the source pod's node, ingress at the destination pod's node. For each IP family both
ends have, it prints each direction's verdict and the policies that decide it.

A pod that has no address yet (pending, or a Pod manifest FILE not applied) is judged by its
namespace, labels and ports at a stand-in address; the verdicts that rules naming addresses
(ipBlock, networks) could change once it has its own are marked.

With --kernel it also checks this node's kernel for what each verdict judged here depends on:
where each stage's dispatch leads the pod (the dispatch maps of the nftables table, or the
dispatch chains of the iptables backend) and the peer's membership in every pod set the
deciding policies name. It checks the backend the agent has programmed on this node: the
nftables table inet netwarden, else the NETWARDEN-* chains of iptables-nft or iptables-legacy.
A mismatch is printed as KERNEL MISMATCH and makes explain exit non-zero, as does a node
where no backend is programmed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := f.logger(os.Stderr)
			if err != nil {
				return err
			}
			proto, portNum, err := parsePortProto(port)
			if err != nil {
				return err
			}
			if from == "" || to == "" {
				return fmt.Errorf("--from and --to are required (NAMESPACE/POD or an IP address)")
			}
			st, err := f.loadState(cmd.Context(), log)
			if err != nil {
				return err
			}
			if st, from, err = withPodFile(st, "--from", from); err != nil {
				return err
			}
			if st, to, err = withPodFile(st, "--to", to); err != nil {
				return err
			}
			st, standIns := policy.WithStandIns(st, unscheduled, from, to)
			src, err := resolveEndpoint(st, "--from", from)
			if err != nil {
				return err
			}
			dst, err := resolveEndpoint(st, "--to", to)
			if err != nil {
				return err
			}
			for _, e := range []*endpoint{&src, &dst} {
				if ips := standIns[e.name]; ips != nil {
					e.standIn = true
					fmt.Fprintf(cmd.OutOrStdout(), "%s has no address yet: judged by its namespace, labels and ports, at stand-in address %s\n",
						e.name, joinAddrs(ips))
				}
			}
			var kc *kernelCheck
			if kernel {
				node, err := f.resolveNodeName()
				if err != nil {
					return err
				}
				kc, err = detectKernel(cmd.Context(), node)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "kernel of node %s: %s backend\n", node, kc.backend)
			}
			if staged {
				nps, cnps := policy.Staged(st)
				fmt.Fprintf(cmd.OutOrStdout(), "staged (not enforced): %d NetworkPolicies %v, %d ClusterNetworkPolicies %v\n", len(nps), sorted(nps), len(cnps), sorted(cnps))
			}
			return explainWith(cmd.OutOrStdout(), st, src, dst, proto, portNum, kc, staged)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the connecting side: NAMESPACE/POD, an IP address, or a Pod manifest file not applied yet")
	cmd.Flags().StringVar(&to, "to", "", "the accepting side: NAMESPACE/POD, an IP address, or a Pod manifest file not applied yet")
	cmd.Flags().StringVar(&port, "port", "", "destination port and protocol, e.g. 80/tcp (tcp, udp or sctp)")
	fs := cmd.Flags()
	fs.StringVar(&f.nodeName, "node-name", "", "this node's name, for --kernel (default $NODE_NAME, then the hostname); each direction is judged at its pod's node")
	fs.BoolVar(&staged, "staged", false, "also judge each direction as it will be once the staged policies (annotated "+policy.StagedAnnotation+": \"true\") are enforced: would-deny, would-allow or no change")
	fs.BoolVar(&kernel, "kernel", false, "also check this node's kernel (the nftables or iptables backend the agent programmed) for the dispatch and peer set memberships the verdicts judged here depend on")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API; in-cluster config when empty and KUBERNETES_SERVICE_HOST is set")
	fs.StringVar(&f.manifests, "manifests", "", "read cluster state from the manifests in this directory instead of the API")
	fs.StringVar(&f.logLevel, "log-level", "warn", "log verbosity: debug, info, warn or error")
	return cmd
}

func parsePortProto(s string) (policy.Protocol, uint16, error) {
	num, proto, ok := strings.Cut(s, "/")
	if !ok {
		proto = "tcp"
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("--port %q: want PORT/PROTO with PORT in 1-65535, e.g. 80/tcp", s)
	}
	switch p := policy.Protocol(strings.ToLower(proto)); p {
	case policy.TCP, policy.UDP, policy.SCTP:
		return p, uint16(n), nil
	}
	return "", 0, fmt.Errorf("--port %q: protocol %q is not tcp, udp or sctp", s, proto)
}

// endpoint is one side of the connection: a pod that NetworkPolicy applies to, or an address.
type endpoint struct {
	name    string // namespace/name of the pod, or the address
	pod     bool
	node    string
	ips     []netip.Addr
	standIn bool // the pod has no address yet: ips stand in for it (see policy.WithStandIns)
}

func joinAddrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, a := range ips {
		s[i] = a.String()
	}
	return strings.Join(s, " and ")
}

func resolveEndpoint(st *cluster.State, flag, s string) (endpoint, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		ip = ip.Unmap()
		for key, p := range st.Pods.All() {
			for _, pip := range policy.EligibleIPs(p) {
				if pip == ip {
					return endpoint{name: key, pod: true, node: p.NodeName, ips: []netip.Addr{ip}}, nil
				}
			}
		}
		return endpoint{name: ip.String(), ips: []netip.Addr{ip}}, nil
	}
	p := st.Pods.Get(s)
	if p == nil {
		return endpoint{}, fmt.Errorf("%s %q: no such pod (want NAMESPACE/POD or an IP address)", flag, s)
	}
	ips := policy.EligibleIPs(p)
	if len(ips) == 0 {
		return endpoint{}, fmt.Errorf("%s %s: the pod has no address NetworkPolicy applies to (no pod IP yet, host network, or finished)", flag, s)
	}
	return endpoint{name: s, pod: true, node: p.NodeName, ips: ips}, nil
}

// kernelCheck is explain --kernel: the node whose kernel is at hand, the backend programmed
// there, and what it found wrong.
type kernelCheck struct {
	ctx        context.Context
	node       string
	backend    string
	ipt        *xtables.Runner // the iptables variant holding our chains, for that backend
	mismatches int
}

// detectKernel finds the backend the agent programmed here. The agent retires the other
// backends' rules when it picks one, so the first found is the one judging packets; checking
// a backend that holds nothing would report every fact as a mismatch and hide the real cause.
func detectKernel(ctx context.Context, node string) (*kernelCheck, error) {
	if nftables.Programmed(ctx) {
		return &kernelCheck{ctx: ctx, node: node, backend: "nftables"}, nil
	}
	if r := iptables.Programmed(ctx); r != nil {
		return &kernelCheck{ctx: ctx, node: node, backend: "iptables-" + string(r.Mode), ipt: r}, nil
	}
	return nil, fmt.Errorf("--kernel: no NetworkPolicy backend of netwarden is programmed in this network namespace's kernel "+
		"(no nftables table inet %s, no %sFORWARD chain in iptables-nft or iptables-legacy): is the agent running on node %s?",
		nftables.TableName, iptables.ChainPrefix, node)
}

// facts looks up what a verdict judged here depends on in the backend at hand.
func (kc *kernelCheck) facts(rs *policy.Ruleset, dir policy.Direction, localIP, peerIP netip.Addr) (exps []fmt.Stringer, bad []string, err error) {
	if kc.ipt != nil {
		e := iptables.Expectations(rs, dir, localIP, peerIP)
		bad, err = iptables.Check(kc.ctx, kc.ipt, e)
		return stringers(e), bad, err
	}
	e := nftables.Expectations(rs, dir, localIP, peerIP)
	bad, err = nftables.Check(kc.ctx, e)
	return stringers(e), bad, err
}

func stringers[T fmt.Stringer](in []T) []fmt.Stringer {
	out := make([]fmt.Stringer, len(in))
	for i, v := range in {
		out[i] = v
	}
	return out
}

// explain prints, for each family both ends have, the egress and ingress judgements.
func explain(out io.Writer, st *cluster.State, src, dst endpoint, proto policy.Protocol, port uint16) error {
	return explainWith(out, st, src, dst, proto, port, nil, false)
}

// explainWith is explain, checking the kernel with kc when it is set, and judging each
// direction as it would be with the staged policies enforced too when staged is set.
func explainWith(out io.Writer, st *cluster.State, src, dst endpoint, proto policy.Protocol, port uint16, kc *kernelCheck, staged bool) error {
	rulesetOf := compiledPerNode(st, policy.Compile)
	var stagedOf func(string) *policy.Ruleset
	if staged {
		stagedOf = compiledPerNode(st, policy.CompileAsWritten)
	}
	what := fmt.Sprintf("%s/%d", strings.ToUpper(string(proto)), port)
	families := 0
	for _, sip := range src.ips {
		for _, dip := range dst.ips {
			if sip.Is4() != dip.Is4() {
				continue
			}
			families++
			fmt.Fprintf(out, "%s (%s) -> %s (%s) %s:\n", src.name, sip, dst.name, dip, what)
			egress, stagedEgress := judgeSide(out, rulesetOf, stagedOf, policy.Egress, src, dst, sip, dip, proto, port, what, kc)
			ingress, stagedIngress := judgeSide(out, rulesetOf, stagedOf, policy.Ingress, dst, src, dip, sip, proto, port, what, kc)
			verdict := "allowed"
			if !egress || !ingress {
				verdict = "denied"
			}
			fmt.Fprintf(out, "  verdict: %s\n", verdict)
			if staged {
				now, then := egress && ingress, stagedEgress && stagedIngress
				switch {
				case now && !then:
					fmt.Fprintf(out, "  staged:  would-deny (allowed now, denied once the staged policies apply)\n")
				case !now && then:
					fmt.Fprintf(out, "  staged:  would-allow (denied now, allowed once the staged policies apply)\n")
				default:
					fmt.Fprintf(out, "  staged:  no change\n")
				}
			}
		}
	}
	if families == 0 {
		return fmt.Errorf("%s and %s have no address family in common", src.name, dst.name)
	}
	if kc != nil && kc.mismatches > 0 {
		return fmt.Errorf("the kernel of node %s does not hold what the model says: %d mismatches (see KERNEL MISMATCH above)", kc.node, kc.mismatches)
	}
	return nil
}

// judgeSide prints and returns the verdict of direction dir at local (the pod whose side it is:
// the source for egress, the destination for ingress) towards peer.
// With stagedOf, it also judges with the staged policies enforced and returns that verdict as
// staged, printing it where it differs.
func judgeSide(out io.Writer, rulesetOf, stagedOf func(node string) *policy.Ruleset, dir policy.Direction, local, peer endpoint,
	localIP, peerIP netip.Addr, proto policy.Protocol, port uint16, what string, kc *kernelCheck) (allowed, staged bool) {
	label := fmt.Sprintf("%s:", dir)
	if !local.pod {
		fmt.Fprintf(out, "  %-8s allowed (%s is no pod: NetworkPolicy does not judge its %s)\n", label, local.name, dir)
		return true, true
	}
	rs := rulesetOf(local.node)
	kernelHere := kc
	if kc != nil && local.node != kc.node {
		kernelHere = nil // the kernel at hand is not the one judging this direction
	}
	judged, domains := withKernelDomains(rs, kernelHere)
	j := judged.Judge(dir, localIP, peerIP, proto, port)
	fmt.Fprintf(out, "  %-8s %s\n", label, describe(j, local.name, peer.name, what))
	if dir == policy.Egress {
		domains(out)
	}
	staged = j.Allowed
	if stagedOf != nil {
		sj := stagedOf(local.node).Judge(dir, localIP, peerIP, proto, port)
		if staged = sj.Allowed; sj.Allowed != j.Allowed {
			fmt.Fprintf(out, "           staged: %s\n", describe(sj, local.name, peer.name, what))
		}
	}
	if peer.standIn {
		noteStandIn(out, rs, dir, localIP, peer)
	}
	switch {
	case kc != nil && (local.standIn || peer.standIn):
		fmt.Fprintf(out, "           kernel: not checked (a pod without an address has nothing in the kernel yet)\n")
	case kc != nil:
		kc.check(out, rs, dir, local, localIP, peerIP)
	}
	return j.Allowed, staged
}

// compiledPerNode returns the ruleset of each node compile gives for st, compiled once.
func compiledPerNode(st *cluster.State, compile func(*cluster.State, string) (*policy.Ruleset, policy.Stats)) func(string) *policy.Ruleset {
	rulesets := map[string]*policy.Ruleset{}
	return func(node string) *policy.Ruleset {
		if rs, ok := rulesets[node]; ok {
			return rs
		}
		rs, _ := compile(st, node)
		rulesets[node] = rs
		return rs
	}
}

// check prints what the kernel of this node says about the facts a verdict judged here
// depends on.
func (kc *kernelCheck) check(out io.Writer, rs *policy.Ruleset, dir policy.Direction, local endpoint, localIP, peerIP netip.Addr) {
	if local.node != kc.node {
		fmt.Fprintf(out, "           kernel: not checked (%s is on node %s, this is %s)\n", local.name, local.node, kc.node)
		return
	}
	exps, bad, err := kc.facts(rs, dir, localIP, peerIP)
	if err != nil {
		kc.mismatches++
		fmt.Fprintf(out, "           KERNEL MISMATCH: %v\n", err)
		return
	}
	for _, b := range bad {
		kc.mismatches++
		fmt.Fprintf(out, "           KERNEL MISMATCH: %s\n", b)
	}
	if len(bad) == 0 {
		fmt.Fprintf(out, "           kernel: agrees (%d facts: %s)\n", len(exps), joinExpectations(exps))
	}
}

func joinExpectations(exps []fmt.Stringer) string {
	s := make([]string, len(exps))
	for i, e := range exps {
		s[i] = e.String()
	}
	return strings.Join(s, "; ")
}

// describe words a judgement of the direction of local (the pod judged) towards peer, stage by
// stage: the admin tier, NetworkPolicy, the baseline tier.
func describe(j policy.Judgement, local, peer, what string) string {
	var parts []string
	if t := j.Admin; t != nil {
		if t.Action != policy.Pass || t.Policy != "" {
			s := describeTier("admin", t, j.Direction)
			if t.Action != policy.Pass {
				return s
			}
			parts = append(parts, s)
		} else {
			parts = append(parts, fmt.Sprintf("admin tier: no rule of %s matches", strings.Join(t.Selecting, ", ")))
		}
	}
	switch {
	case !j.Isolated:
		kind := "policy"
		if j.Admin != nil || j.Baseline != nil {
			kind = "NetworkPolicy"
		}
		parts = append(parts, fmt.Sprintf("no %s selects %s for %s", kind, local, j.Direction))
		if t := j.Baseline; t != nil {
			if t.Policy == "" {
				parts = append(parts, fmt.Sprintf("baseline tier: no rule of %s matches", strings.Join(t.Selecting, ", ")))
			} else {
				parts = append(parts, describeTier("baseline", t, j.Direction))
			}
		}
	case j.Allowed:
		parts = append(parts, fmt.Sprintf("allowed by %s (its %s rule %d admits %s on %s)", j.AllowedBy, j.Direction, j.Rule+1, peer, what))
	default:
		parts = append(parts, fmt.Sprintf("denied by default isolation of %s (selected by %s; no rule admits %s on %s)",
			local, strings.Join(j.Selecting, ", "), peer, what))
	}
	verdict := "denied"
	if j.Allowed {
		verdict = "allowed"
	}
	if !j.Isolated {
		return verdict + " (" + strings.Join(parts, "; ") + ")"
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], "; ") + "; " + parts[len(parts)-1]
}

// describeTier words the rule of a tier that matched.
func describeTier(tier string, t *policy.TierJudgement, dir policy.Direction) string {
	rule := fmt.Sprintf("%s rule %d", dir, t.Rule+1)
	if t.RuleName != "" {
		rule += fmt.Sprintf(" %q", t.RuleName)
	}
	switch t.Action {
	case policy.Accept:
		return fmt.Sprintf("allowed by ClusterNetworkPolicy %s (%s tier, its %s accepts)", t.Policy, tier, rule)
	case policy.Deny:
		return fmt.Sprintf("denied by ClusterNetworkPolicy %s (%s tier, its %s denies)", t.Policy, tier, rule)
	}
	return fmt.Sprintf("%s tier: passed by ClusterNetworkPolicy %s (its %s)", tier, t.Policy, rule)
}

func sorted(s []string) []string { slices.Sort(s); return s }
