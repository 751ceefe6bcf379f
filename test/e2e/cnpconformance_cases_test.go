package e2e

// The upstream ClusterNetworkPolicy conformance suite (sigs.k8s.io/network-policy-api v0.3.0,
// conformance/tests/*.go), translated into tables: every ConformanceTest (standard and
// experimental), every t.Run of it by its upstream name, and in each run the mutations (rule
// swaps, action, priority and named-port edits, label changes, deletions, t.Cleanup) and the
// PokeServer expectations in the order upstream makes them. State carries over from run to run
// as it does upstream (a run's mutations stay for the runs after it); each test starts from the
// base cluster with its manifests applied and ends with them deleted.
//
// TestCNPConformanceTranslation holds the pokes of these tables against the ones parsed from the
// upstream sources; TestCNPOracleConformance holds every expectation against the oracle; the
// kernel suite (cnp_conformance_test.go) probes them.
//
// Two points where a dual-stack bed needs more than the upstream text says: upstream pokes
// status.podIP only, and the kernel suite probes each family both ends have, expecting the same;
// and "allow-egress-to-specific-podIPs" lists each of the two pods' addresses (upstream: podIP
// with /32 or /128), so that the rule holds in both families.

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// confTest is one upstream ConformanceTest.
type confTest struct {
	Name      string   // upstream ShortName
	Manifests []string // upstream manifest files, applied when the test starts
	Features  []string // upstream SupportedFeatures
	Runs      []confRun
}

// confRun is one t.Run of an upstream test.
type confRun struct {
	Name    string // upstream name
	Steps   []confStep
	Cleanup []confMutation // its t.Cleanup, applied when the run ends
}

// confStep is a group of pokes and the mutations upstream makes right before them.
type confStep struct {
	Mutate  []confMutation
	Pokes   []confPoke
	cleanup bool
}

// confMutation changes the cluster as an upstream test does through the API.
type confMutation struct {
	Desc  string
	Apply func(c *cnpCluster) error
}

// confPoke is one PokeServer: from a pod, to a pod's address, protocol and port, and whether
// the connection must succeed (false: it must time out).
type confPoke struct {
	From, Proto, To string // pods as "<namespace without the suite's prefix>/<name>"
	Port            int
	Want            bool
}

func (p confPoke) String() string {
	return fmt.Sprintf("%s -> %s %s/%d want %s", p.From, p.To, p.Proto, p.Port, verdict(p.Want))
}

// The suite's pods, by their short names.
const (
	hp0  = "gryffindor/harry-potter-0"
	hp1  = "gryffindor/harry-potter-1"
	dm0  = "slytherin/draco-malfoy-0"
	dm1  = "slytherin/draco-malfoy-1"
	cd0  = "hufflepuff/cedric-diggory-0"
	cd1  = "hufflepuff/cedric-diggory-1"
	ll0  = "ravenclaw/luna-lovegood-0"
	ll1  = "ravenclaw/luna-lovegood-1"
	cen1 = "forbidden-forrest/centaur-1"

	conformanceRole = "conformance-role"
)

// confKey is the cluster key of a pod or namespace given by its short name.
func confKey(short string) string { return confNSPrefix + short }

// hostPort is the suite's s.HostNetworkPorts[i].
func hostPort(i int) int { return confHostNetworkPorts[i] }

func run(name string, steps ...confStep) confRun {
	r := confRun{Name: name}
	for _, s := range steps {
		if s.cleanup {
			r.Cleanup = append(r.Cleanup, s.Mutate...)
		} else {
			r.Steps = append(r.Steps, s)
		}
	}
	return r
}

func step(m []confMutation, pokes ...confPoke) confStep { return confStep{Mutate: m, Pokes: pokes} }

func cleanup(m ...confMutation) confStep { return confStep{Mutate: m, cleanup: true} }

func muts(m ...confMutation) []confMutation { return m }

func poke(from, proto, to string, port int, want bool) confPoke {
	return confPoke{From: from, Proto: proto, To: to, Port: port, Want: want}
}

type confDir bool

const (
	egress  confDir = false
	ingress confDir = true
)

func (d confDir) String() string {
	if d == ingress {
		return "ingress"
	}
	return "egress"
}

func getCNP(c *cnpCluster, name string) (*npav1beta1.ClusterNetworkPolicy, error) {
	cnp, ok := c.CNPs[name]
	if !ok {
		return nil, fmt.Errorf("no ClusterNetworkPolicy %s", name)
	}
	return cnp, nil
}

// ruleCount is the number of rules of one direction, for index checks.
func ruleCount(cnp *npav1beta1.ClusterNetworkPolicy, d confDir) int {
	if d == ingress {
		return len(cnp.Spec.Ingress)
	}
	return len(cnp.Spec.Egress)
}

func cnpMutation(desc, name string, f func(cnp *npav1beta1.ClusterNetworkPolicy) error) confMutation {
	return confMutation{Desc: desc, Apply: func(c *cnpCluster) error {
		cnp, err := getCNP(c, name)
		if err != nil {
			return err
		}
		return f(cnp)
	}}
}

// swapRules swaps two rules of one direction (upstream: mutate.Spec.Egress[i], [j] = [j], [i]).
func swapRules(name string, d confDir, i, j int) confMutation {
	return cnpMutation(fmt.Sprintf("swap %s rules %d and %d of %s", d, i, j, name), name, func(cnp *npav1beta1.ClusterNetworkPolicy) error {
		if n := ruleCount(cnp, d); i >= n || j >= n {
			return fmt.Errorf("%s has %d %s rules", name, n, d)
		}
		if d == ingress {
			cnp.Spec.Ingress[i], cnp.Spec.Ingress[j] = cnp.Spec.Ingress[j], cnp.Spec.Ingress[i]
		} else {
			cnp.Spec.Egress[i], cnp.Spec.Egress[j] = cnp.Spec.Egress[j], cnp.Spec.Egress[i]
		}
		return nil
	})
}

// setAction changes the action of a rule.
func setAction(name string, d confDir, i int, a npav1beta1.ClusterNetworkPolicyRuleAction) confMutation {
	return cnpMutation(fmt.Sprintf("%s rule %d of %s becomes %s", d, i, name, a), name, func(cnp *npav1beta1.ClusterNetworkPolicy) error {
		if n := ruleCount(cnp, d); i >= n {
			return fmt.Errorf("%s has %d %s rules", name, n, d)
		}
		if d == ingress {
			cnp.Spec.Ingress[i].Action = a
		} else {
			cnp.Spec.Egress[i].Action = a
		}
		return nil
	})
}

// setNamedPort replaces the protocols of a rule with one destinationNamedPort.
func setNamedPort(name string, d confDir, i int, port string) confMutation {
	return cnpMutation(fmt.Sprintf("%s rule %d of %s: protocols become destinationNamedPort %q", d, i, name, port), name, func(cnp *npav1beta1.ClusterNetworkPolicy) error {
		if n := ruleCount(cnp, d); i >= n {
			return fmt.Errorf("%s has %d %s rules", name, n, d)
		}
		p := []npav1beta1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: port}}
		if d == ingress {
			cnp.Spec.Ingress[i].Protocols = p
		} else {
			cnp.Spec.Egress[i].Protocols = p
		}
		return nil
	})
}

// setPriority changes a policy's priority.
func setPriority(name string, p int32) confMutation {
	return cnpMutation(fmt.Sprintf("priority of %s becomes %d", name, p), name, func(cnp *npav1beta1.ClusterNetworkPolicy) error {
		cnp.Spec.Priority = p
		return nil
	})
}

// prependNetworksRule inserts, before every egress rule, an Accept rule whose peer is networks
// holding the addresses of the given pods (a host prefix per address; upstream lists podIP).
func prependNetworksRule(name, rule string, pods ...string) confMutation {
	return confMutation{Desc: fmt.Sprintf("prepend to %s an Accept rule %q to the networks of %v", name, rule, pods), Apply: func(c *cnpCluster) error {
		cnp, err := getCNP(c, name)
		if err != nil {
			return err
		}
		var nets []npav1beta1.CIDR
		for _, short := range pods {
			p, ok := c.Pods[confKey(short)]
			if !ok {
				return fmt.Errorf("no pod %s", short)
			}
			for _, ip := range podAddrs(p) {
				nets = append(nets, npav1beta1.CIDR(netip.PrefixFrom(ip, ip.BitLen()).String()))
			}
		}
		r := npav1beta1.ClusterNetworkPolicyEgressRule{Name: rule, Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
			To: []npav1beta1.ClusterNetworkPolicyEgressPeer{{Networks: nets}}}
		cnp.Spec.Egress = append([]npav1beta1.ClusterNetworkPolicyEgressRule{r}, cnp.Spec.Egress...)
		return nil
	}}
}

// setNamespaceLabels replaces a namespace's labels (upstream: SetLabels and a merge patch; the
// API server keeps kubernetes.io/metadata.name, which the oracle and the agent add themselves).
func setNamespaceLabels(short string, labels map[string]string) confMutation {
	return confMutation{Desc: fmt.Sprintf("labels of namespace %s become %v", short, labels), Apply: func(c *cnpCluster) error {
		ns, ok := c.Namespaces[confKey(short)]
		if !ok {
			return fmt.Errorf("no namespace %s", short)
		}
		ns.Labels = map[string]string{}
		for k, v := range labels {
			ns.Labels[k] = v
		}
		return nil
	}}
}

func setPodLabel(short, key, value string) confMutation {
	return confMutation{Desc: fmt.Sprintf("label %s=%s on pod %s", key, value, short), Apply: func(c *cnpCluster) error {
		p, ok := c.Pods[confKey(short)]
		if !ok {
			return fmt.Errorf("no pod %s", short)
		}
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[key] = value
		return nil
	}}
}

func removePodLabel(short, key string) confMutation {
	return confMutation{Desc: fmt.Sprintf("label %s removed from pod %s", key, short), Apply: func(c *cnpCluster) error {
		p, ok := c.Pods[confKey(short)]
		if !ok {
			return fmt.Errorf("no pod %s", short)
		}
		delete(p.Labels, key)
		return nil
	}}
}

func deleteNP(shortNS, name string) confMutation {
	return confMutation{Desc: fmt.Sprintf("NetworkPolicy %s/%s deleted", shortNS, name), Apply: func(c *cnpCluster) error {
		key := confKey(shortNS) + "/" + name
		if _, ok := c.NPs[key]; !ok {
			return fmt.Errorf("no NetworkPolicy %s", key)
		}
		delete(c.NPs, key)
		return nil
	}}
}

// confPokeAt is a poke with the run it belongs to.
type confPokeAt struct {
	Run string
	confPoke
}

// confBatch is what a kernel run applies at once: mutations, then pokes that no mutation
// separates (upstream runs without mutations between them share a batch). The first batch of a
// test is the state its manifests make, before any mutation.
type confBatch struct {
	Mutations []confMutation
	Runs      []string // the runs whose pokes (or mutations) it holds
	Pokes     []confPokeAt
}

// batches groups a test's steps: a batch ends where a mutation follows a poke.
func (ct confTest) batches() []confBatch {
	out := []confBatch{{}}
	cur := &out[0]
	add := func(run string, m []confMutation, pokes []confPoke) {
		if len(m) > 0 && (len(cur.Pokes) > 0 || len(out) == 1) {
			out = append(out, confBatch{})
			cur = &out[len(out)-1]
		}
		cur.Mutations = append(cur.Mutations, m...)
		if !slices.Contains(cur.Runs, run) {
			cur.Runs = append(cur.Runs, run)
		}
		for _, p := range pokes {
			cur.Pokes = append(cur.Pokes, confPokeAt{run, p})
		}
	}
	for _, r := range ct.Runs {
		for _, s := range r.Steps {
			add(r.Name, s.Mutate, s.Pokes)
		}
		add(r.Name, r.Cleanup, nil)
	}
	return out
}

// applyManifests adds a test's objects to the cluster.
func applyConfManifests(c *cnpCluster, names []string) ([]byte, error) {
	cnps, nps, text, err := loadConfPolicies(names)
	if err != nil {
		return nil, err
	}
	for _, cnp := range cnps {
		c.CNPs[cnp.Name] = cnp
	}
	for _, np := range nps {
		c.NPs[np.Namespace+"/"+np.Name] = np
	}
	return text, nil
}

// deleteConfManifests removes every policy, as each test's cleanup deletes what its manifests
// created (and the base manifests create none).
func deleteConfManifests(c *cnpCluster) {
	clear(c.CNPs)
	clear(c.NPs)
}

// confPodRef resolves a short pod name in a cluster.
func confPodRef(c *cnpCluster, short string) (*corev1.Pod, error) {
	p, ok := c.Pods[confKey(short)]
	if !ok {
		return nil, fmt.Errorf("no pod %s", short)
	}
	return p, nil
}

// confTests is the translation, in upstream order.
var confTests = []confTest{
	{Name: "CNPAdminTierEgressNamedPort", Manifests: []string{"base/admin_tier/standard-egress-tcp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy", "SupportClusterNetworkPolicyNamedPorts"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for named port",
			step(muts(setNamedPort("egress-tcp", egress, 5, "web")),
				poke(hp0, "tcp", cd1, 80, true),
				poke(hp1, "tcp", cd1, 8080, false),
			),
		),
	}},
	{Name: "CNPAdminTierEgressNodePeers", Manifests: []string{"base/admin_tier/experimental-egress-selector-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy", "SupportClusterNetworkPolicyEgressNodePeers"}, Runs: []confRun{
		run("Should support an 'allow-egress' rule policy for egress-node-peer",
			step(nil,
				poke(hp1, "tcp", cen1, hostPort(0), true),
			),
		),
		run("Should support a 'pass-egress' rule policy for egress-node-peer",
			step(nil,
				poke(hp1, "udp", cen1, hostPort(2), true),
			),
		),
		run("Should support a 'deny-egress' rule policy for egress-node-peer",
			step(nil,
				poke(hp1, "tcp", cen1, hostPort(1), false),
				poke(hp1, "udp", cen1, hostPort(4), false),
				poke(hp1, "sctp", cen1, hostPort(6), false),
			),
		),
	}},
	{Name: "CNPAdminTierEgressInlineCIDRPeers", Manifests: []string{"base/admin_tier/standard-egress-inline-cidr-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support a 'deny-egress' rule policy for egress-cidr-peer",
			step(nil,
				poke(hp1, "tcp", ll0, 80, false),
				poke(hp1, "udp", ll0, 53, false),
				poke(hp1, "sctp", ll0, 9003, false),
				poke(hp1, "tcp", cd0, 80, false),
				poke(hp1, "udp", cd0, 53, false),
				poke(hp1, "sctp", cd0, 9003, false),
				poke(hp1, "tcp", dm0, 80, true),
				poke(hp1, "udp", dm0, 53, true),
				poke(hp1, "sctp", dm0, 9003, true),
			),
			step(muts(setNamespaceLabels("slytherin", map[string]string{"conformance-house": "denied-namespace-label"})),
				poke(hp1, "tcp", dm0, 80, false),
				poke(hp1, "udp", dm0, 53, false),
				poke(hp1, "sctp", dm0, 9003, false),
			),
			step(muts(setNamespaceLabels("slytherin", map[string]string{"conformance-house": "slytherin"})),
				poke(hp1, "tcp", dm0, 80, true),
				poke(hp1, "udp", dm0, 53, true),
				poke(hp1, "sctp", dm0, 9003, true),
			),
		),
		run("Should support an 'allow-egress' rule policy for egress-cidr-peer",
			step(muts(prependNetworksRule("inline-cidr-as-peers-example", "allow-egress-to-specific-podIPs", ll0, cd0)),
				poke(hp1, "tcp", ll0, 80, true),
				poke(hp1, "udp", ll0, 53, true),
				poke(hp1, "sctp", ll0, 9003, true),
				poke(hp1, "tcp", cd0, 80, true),
				poke(hp1, "udp", cd0, 53, true),
				poke(hp1, "sctp", cd0, 9003, true),
				poke(hp1, "tcp", ll1, 80, false),
				poke(hp1, "udp", ll1, 53, false),
				poke(hp1, "sctp", ll1, 9003, false),
				poke(hp1, "tcp", cd1, 80, false),
				poke(hp1, "udp", cd1, 53, false),
				poke(hp1, "sctp", cd1, 9003, false),
			),
		),
	}},
	{Name: "CNPAdminTierEgressSCTP", Manifests: []string{"base/admin_tier/standard-egress-sctp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for SCTP protocol; ensure rule ordering is respected",
			step(nil,
				poke(ll0, "sctp", hp0, 9003, true),
				poke(ll1, "sctp", hp0, 9005, true),
			),
		),
		run("Should support an 'allow-egress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(ll0, "sctp", cd1, 9003, true),
				poke(ll1, "sctp", cd1, 9005, false),
			),
		),
		run("Should support an 'deny-egress' policy for SCTP protocol; ensure rule ordering is respected",
			step(muts(swapRules("egress-sctp", egress, 0, 1)),
				poke(ll0, "sctp", hp1, 9003, false),
				poke(ll1, "sctp", hp1, 9005, false),
			),
		),
		run("Should support a 'deny-egress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(ll0, "sctp", dm0, 9003, false),
				poke(ll1, "sctp", dm0, 9005, true),
			),
		),
		run("Should support an 'pass-egress' policy for SCTP protocol; ensure rule ordering is respected",
			step(muts(swapRules("egress-sctp", egress, 0, 2)),
				poke(ll0, "sctp", hp1, 9003, true),
				poke(ll1, "sctp", hp1, 9005, true),
			),
		),
		run("Should support a 'pass-egress' policy for SCTP protocol at the specified port",
			step(muts(swapRules("egress-sctp", egress, 3, 4)),
				poke(ll0, "sctp", dm0, 9003, true),
				poke(ll1, "sctp", dm0, 9005, true),
			),
		),
	}},
	{Name: "CNPAdminTierEgressTCP", Manifests: []string{"base/admin_tier/standard-egress-tcp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for TCP protocol; ensure rule ordering is respected",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", ll0, 8080, true),
			),
		),
		run("Should support an 'allow-egress' policy for TCP protocol at the specified port",
			step(nil,
				poke(hp0, "tcp", cd1, 8080, true),
				poke(hp1, "tcp", cd1, 80, false),
			),
		),
		run("Should not affect ingress traffic when only egress rules are specified",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(dm0, "tcp", hp1, 80, true),
			),
		),
		run("Should support an 'deny-egress' policy for TCP protocol; ensure rule ordering is respected",
			step(muts(swapRules("egress-tcp", egress, 0, 1)),
				poke(hp0, "tcp", ll1, 80, false),
				poke(hp1, "tcp", ll1, 8080, false),
			),
		),
		run("Should support a 'deny-egress' policy for TCP protocol at the specified port",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, true),
			),
		),
		run("Should support an 'pass-egress' policy for TCP protocol; ensure rule ordering is respected",
			step(muts(swapRules("egress-tcp", egress, 0, 2)),
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", ll0, 8080, true),
			),
		),
		run("Should support a 'pass-egress' policy for TCP protocol at the specified port",
			step(muts(swapRules("egress-tcp", egress, 3, 4)),
				poke(hp0, "tcp", dm0, 80, true),
				poke(hp1, "tcp", dm0, 8080, true),
			),
		),
	}},
	{Name: "CNPAdminTierEgressUDP", Manifests: []string{"base/admin_tier/standard-egress-udp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for UDP protocol; ensure rule ordering is respected",
			step(nil,
				poke(cd0, "udp", ll0, 53, true),
				poke(cd1, "udp", ll0, 5353, true),
			),
		),
		run("Should support an 'allow-egress' policy for UDP protocol at the specified port",
			step(nil,
				poke(cd0, "udp", hp1, 53, true),
				poke(cd1, "udp", hp1, 5353, false),
			),
		),
		run("Should support an 'deny-egress' policy for UDP protocol; ensure rule ordering is respected",
			step(muts(swapRules("egress-udp", egress, 0, 1)),
				poke(cd0, "udp", ll1, 53, false),
				poke(cd1, "udp", ll1, 5353, false),
			),
		),
		run("Should support a 'deny-egress' policy for UDP protocol at the specified port",
			step(nil,
				poke(cd0, "udp", dm0, 5353, false),
				poke(cd1, "udp", dm0, 53, true),
			),
		),
		run("Should support an 'pass-egress' policy for UDP protocol; ensure rule ordering is respected",
			step(muts(swapRules("egress-udp", egress, 0, 2)),
				poke(cd0, "udp", ll1, 5353, true),
				poke(cd1, "udp", ll1, 53, true),
			),
		),
		run("Should support a 'pass-egress' policy for UDP protocol at the specified port",
			step(muts(swapRules("egress-udp", egress, 3, 4)),
				poke(cd0, "udp", dm0, 5353, true),
				poke(cd1, "udp", dm0, 53, true),
			),
		),
	}},
	{Name: "CNPAdminTierGress", Manifests: []string{"base/admin_tier/standard-gress-rules-combined.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-gress' policy across different protocols",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "udp", ll0, 53, true),
				poke(hp0, "sctp", ll0, 9003, true),
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll1, "udp", hp0, 53, true),
				poke(ll1, "sctp", hp0, 9003, true),
			),
		),
		run("Should support an 'allow-gress' policy across different protocols at the specified ports",
			step(nil,
				poke(hp0, "tcp", cd1, 8080, true),
				poke(hp1, "tcp", cd1, 80, false),
				poke(hp0, "udp", cd1, 5353, true),
				poke(hp1, "udp", cd1, 53, false),
				poke(hp0, "sctp", cd1, 9003, true),
				poke(hp1, "sctp", cd1, 9005, false),
				poke(cd0, "tcp", hp1, 80, true),
				poke(cd1, "tcp", hp1, 8080, false),
				poke(cd0, "udp", hp1, 5353, true),
				poke(cd1, "udp", hp1, 53, false),
				poke(cd0, "sctp", hp1, 9003, true),
				poke(cd1, "sctp", hp1, 9005, false),
			),
		),
		run("Should support an 'deny-gress' policy across different protocols",
			step(muts(swapRules("gress-rules", egress, 0, 1), swapRules("gress-rules", ingress, 0, 1)),
				poke(hp0, "tcp", ll1, 80, false),
				poke(hp1, "udp", ll1, 53, false),
				poke(hp0, "sctp", ll1, 9003, false),
				poke(ll0, "tcp", hp1, 80, false),
				poke(ll1, "udp", hp1, 53, false),
				poke(ll1, "sctp", hp1, 9003, false),
			),
		),
		run("Should support a 'deny-gress' policy across different protocols at the specified ports",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, true),
				poke(hp0, "udp", dm0, 53, false),
				poke(hp1, "udp", dm0, 5353, true),
				poke(hp0, "sctp", dm0, 9003, false),
				poke(hp1, "sctp", dm0, 9005, true),
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, true),
				poke(dm0, "udp", hp0, 53, false),
				poke(dm1, "udp", hp0, 5353, true),
				poke(dm0, "sctp", hp0, 9003, false),
				poke(dm1, "sctp", hp0, 9005, true),
			),
		),
		run("Should support an 'pass-gress' policy across different protocols",
			step(muts(swapRules("gress-rules", egress, 0, 2), swapRules("gress-rules", ingress, 0, 2)),
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp0, "udp", ll0, 5353, true),
				poke(hp0, "sctp", ll0, 9003, true),
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll1, "udp", hp0, 53, true),
				poke(ll1, "sctp", hp0, 9003, true),
			),
		),
		run("Should support a 'pass-gress' policy across different protocols at the specified ports",
			step(muts(swapRules("gress-rules", egress, 3, 4), swapRules("gress-rules", ingress, 3, 4)),
				poke(hp0, "tcp", dm0, 80, true),
				poke(hp1, "tcp", dm0, 8080, true),
				poke(hp0, "udp", dm0, 53, true),
				poke(hp1, "udp", dm0, 5353, true),
				poke(hp0, "sctp", dm0, 9003, true),
				poke(hp1, "sctp", dm0, 9005, true),
				poke(dm0, "tcp", hp0, 80, true),
				poke(dm1, "tcp", hp0, 8080, true),
				poke(dm0, "udp", hp0, 53, true),
				poke(dm1, "udp", hp0, 5353, true),
				poke(dm0, "sctp", hp0, 9003, true),
				poke(dm1, "sctp", hp0, 9005, true),
			),
		),
	}},
	{Name: "CNPAdminTierIngressSCTP", Manifests: []string{"base/admin_tier/standard-ingress-sctp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for SCTP protocol; ensure rule ordering is respected",
			step(nil,
				poke(hp0, "sctp", ll0, 9003, true),
				poke(hp1, "sctp", ll0, 9005, true),
			),
		),
		run("Should support an 'allow-ingress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(cd0, "sctp", ll1, 9003, true),
				poke(cd1, "sctp", ll1, 9005, false),
			),
		),
		run("Should support an 'deny-ingress' policy for SCTP protocol; ensure rule ordering is respected",
			step(muts(swapRules("ingress-sctp", ingress, 0, 1)),
				poke(hp0, "sctp", ll1, 9003, false),
				poke(hp1, "sctp", ll1, 9005, false),
			),
		),
		run("Should support a 'deny-ingress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(dm0, "sctp", ll0, 9003, false),
				poke(dm1, "sctp", ll0, 9005, true),
			),
		),
		run("Should support an 'pass-ingress' policy for SCTP protocol; ensure rule ordering is respected",
			step(muts(swapRules("ingress-sctp", ingress, 0, 2)),
				poke(hp0, "sctp", ll1, 9003, true),
				poke(hp1, "sctp", ll1, 9005, true),
			),
		),
		run("Should support a 'pass-ingress' policy for SCTP protocol at the specified port",
			step(muts(swapRules("ingress-sctp", ingress, 3, 4)),
				poke(dm0, "sctp", ll0, 9003, true),
				poke(dm1, "sctp", ll0, 9005, true),
			),
		),
	}},
	{Name: "CNPAdminTierIngressTCP", Manifests: []string{"base/admin_tier/standard-ingress-tcp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for TCP protocol; ensure rule ordering is respected",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll1, "tcp", hp0, 8080, true),
			),
		),
		run("Should support an 'allow-ingress' policy for TCP protocol at the specified port",
			step(nil,
				poke(cd0, "tcp", hp1, 80, true),
				poke(cd1, "tcp", hp1, 8080, false),
			),
		),
		run("Should not affect egress traffic when only ingress rules are specified",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", dm0, 80, true),
			),
		),
		run("Should support an 'deny-ingress' policy for TCP protocol; ensure rule ordering is respected",
			step(muts(swapRules("ingress-tcp", ingress, 0, 1)),
				poke(ll0, "tcp", hp1, 80, false),
				poke(ll1, "tcp", hp1, 8080, false),
			),
		),
		run("Should support a 'deny-ingress' policy for TCP protocol at the specified port",
			step(nil,
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, true),
			),
		),
		run("Should support an 'pass-ingress' policy for TCP protocol; ensure rule ordering is respected",
			step(muts(swapRules("ingress-tcp", ingress, 0, 2)),
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll1, "tcp", hp0, 8080, true),
			),
		),
		run("Should support a 'pass-ingress' policy for TCP protocol at the specified port",
			step(muts(swapRules("ingress-tcp", ingress, 3, 4)),
				poke(dm0, "tcp", hp0, 80, true),
				poke(dm1, "tcp", hp0, 8080, true),
			),
		),
	}},
	{Name: "CNPAdminTierIngressUDP", Manifests: []string{"base/admin_tier/standard-ingress-udp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for UDP protocol; ensure rule ordering is respected",
			step(nil,
				poke(ll0, "udp", cd0, 53, true),
				poke(ll1, "udp", cd0, 5353, true),
			),
		),
		run("Should support an 'allow-ingress' policy for UDP protocol at the specified port",
			step(nil,
				poke(hp0, "udp", cd1, 53, true),
				poke(hp1, "udp", cd1, 5353, false),
			),
		),
		run("Should support an 'deny-ingress' policy for UDP protocol; ensure rule ordering is respected",
			step(muts(swapRules("ingress-udp", ingress, 0, 1)),
				poke(ll0, "udp", cd1, 53, false),
				poke(ll1, "udp", cd1, 5353, false),
			),
		),
		run("Should support a 'deny-ingress' policy for UDP protocol at the specified port",
			step(nil,
				poke(dm0, "udp", cd0, 5353, false),
				poke(dm1, "udp", cd0, 53, true),
			),
		),
		run("Should support an 'pass-ingress' policy for UDP protocol; ensure rule ordering is respected",
			step(muts(swapRules("ingress-udp", ingress, 0, 2)),
				poke(ll0, "udp", cd1, 5353, true),
				poke(ll1, "udp", cd1, 53, true),
			),
		),
		run("Should support a 'pass-ingress' policy for UDP protocol at the specified port",
			step(muts(swapRules("ingress-udp", ingress, 3, 4)),
				poke(dm0, "udp", cd0, 5353, true),
				poke(dm1, "udp", cd0, 53, true),
			),
		),
	}},
	{Name: "CNPAdminTierIngressNamedPort", Manifests: []string{"base/admin_tier/standard-ingress-udp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy", "SupportClusterNetworkPolicyNamedPorts"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for named port",
			step(muts(setNamedPort("ingress-udp", ingress, 5, "dns")),
				poke(hp0, "udp", cd1, 53, true),
				poke(hp1, "udp", cd1, 5353, false),
			),
		),
	}},
	{Name: "CNPAdminTierIntegration", Manifests: []string{"base/api_integration/standard-anp-np-banp.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should Deny traffic from slytherin to gryffindor respecting admin CNP",
			step(nil,
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, false),
			),
		),
		run("Should Deny traffic to slytherin from gryffindor respecting admin CNP",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, false),
			),
		),
		run("Should support a 'pass-ingress' policy for admin CNP and respect the match for network policy",
			step(muts(setAction("pass-example", ingress, 0, npav1beta1.ClusterNetworkPolicyRuleActionPass)),
				poke(dm0, "tcp", hp0, 80, true),
				poke(dm1, "tcp", hp0, 8080, true),
			),
		),
		run("Should support a 'pass-egress' policy for admin CNP and respect the match for network policy",
			step(muts(setAction("pass-example", egress, 0, npav1beta1.ClusterNetworkPolicyRuleActionPass)),
				poke(hp0, "tcp", dm0, 80, true),
				poke(hp1, "tcp", dm0, 8080, true),
			),
		),
		run("Should support a 'pass-ingress' policy for admin CNP and respect the match for baseline cluster network policy",
			step(muts(deleteNP("gryffindor", "allow-gress-from-to-slytherin-to-gryffindor")),
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, false),
			),
		),
		run("Should support a 'pass-egress' policy for admin CNP and respect the match for baseline cluster network policy",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, false),
			),
		),
	}},
	{Name: "CNPAdminTierPodSelector", Manifests: []string{"base/admin_tier/standard-pod-selector-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support pod selectors in egress peers",
			step(nil,
				poke(hp0, "tcp", ll0, 8080, false),
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", ll1, 80, false),
			),
		),
		run("Should support pod selectors in ingress peers",
			step(nil,
				poke(dm1, "tcp", hp1, 80, false),
				poke(dm0, "tcp", hp0, 80, true),
			),
			step(muts(setPodLabel(cd0, conformanceRole, "blocked")),
				poke(cd0, "tcp", hp0, 80, false),
				poke(cd1, "tcp", hp0, 80, true),
			),
			step(muts(removePodLabel(cd0, conformanceRole)),
				poke(cd0, "tcp", hp0, 80, true),
			),
			step(muts(setPodLabel(cd1, conformanceRole, "blocked")),
				poke(cd1, "tcp", hp0, 80, false),
			),
			cleanup(removePodLabel(cd0, conformanceRole), removePodLabel(cd1, conformanceRole)),
		),
		run("Should support pod selectors in the subject",
			step(nil,
				poke(dm0, "tcp", ll1, 80, true),
			),
			step(muts(setPodLabel(ll0, conformanceRole, "restricted")),
				poke(ll0, "tcp", dm0, 80, false),
				poke(ll1, "tcp", dm0, 80, true),
			),
			step(muts(removePodLabel(ll0, conformanceRole)),
				poke(ll0, "tcp", dm0, 80, true),
			),
			step(muts(setPodLabel(ll1, conformanceRole, "restricted")),
				poke(ll1, "tcp", dm0, 80, false),
			),
			cleanup(removePodLabel(ll0, conformanceRole), removePodLabel(ll1, conformanceRole)),
		),
	}},
	{Name: "CNPAdminTierPortRange", Manifests: []string{"base/admin_tier/standard-port-range-rules-combined.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support egress port range rules across different protocols",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp0, "tcp", ll0, 8080, true),
				poke(hp1, "udp", ll0, 53, false),
				poke(hp0, "udp", cd0, 53, true),
				poke(hp0, "udp", cd0, 5353, true),
				poke(hp1, "tcp", cd0, 80, false),
				poke(hp0, "sctp", dm0, 9003, true),
				poke(hp0, "sctp", dm0, 9005, true),
				poke(hp1, "tcp", dm0, 80, false),
			),
		),
		run("Should support ingress port range rules across different protocols",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll0, "tcp", hp0, 8080, true),
				poke(ll1, "udp", hp0, 53, false),
				poke(cd0, "udp", hp0, 53, true),
				poke(cd0, "udp", hp0, 5353, true),
				poke(cd1, "tcp", hp0, 80, false),
				poke(dm0, "sctp", hp0, 9003, true),
				poke(dm0, "sctp", hp0, 9005, true),
				poke(dm1, "tcp", hp0, 80, false),
			),
		),
	}},
	{Name: "CNPAdminTierPriorityField", Manifests: []string{"base/admin_tier/standard-priority-field.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should Deny traffic from slytherin to gryffindor respecting admin CNP",
			step(nil,
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, false),
			),
		),
		run("Should Deny traffic to slytherin from gryffindor respecting admin CNP",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, false),
			),
		),
		run("Should respect admin CNP priority field; thus passing both ingress and egress traffic over to baseline CNP",
			step(muts(setPriority("old-priority-60-new-priority-40-example", 40)),
				poke(dm0, "tcp", hp0, 80, true),
				poke(dm1, "tcp", hp0, 8080, true),
				poke(hp0, "tcp", dm0, 80, true),
				poke(hp1, "tcp", dm0, 8080, true),
			),
		),
	}},
	{Name: "CNPAdminTierSamePriority", Manifests: []string{"base/admin_tier/standard-same-priority.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should deny traffic in both directions for each same-priority policy",
			step(nil,
				poke(dm0, "tcp", hp0, 80, false),
				poke(hp0, "tcp", dm0, 80, false),
				poke(cd0, "tcp", hp0, 80, false),
				poke(hp1, "tcp", cd0, 80, false),
				poke(dm1, "tcp", cd0, 8080, false),
				poke(cd1, "tcp", dm0, 8080, false),
			),
		),
		run("Should not apply one same-priority policy's rules to another policy's subject",
			step(nil,
				poke(dm0, "tcp", hp0, 8080, true),
				poke(hp0, "tcp", dm0, 8080, true),
				poke(dm1, "tcp", cd0, 80, true),
				poke(cd0, "tcp", dm0, 80, true),
			),
		),
		run("Should not affect traffic matching no same-priority policy",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(hp1, "tcp", ll0, 80, true),
			),
		),
	}},
	{Name: "CNPBaselineTierEgressNamedPort", Manifests: []string{"base/baseline_tier/standard-egress-udp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy", "SupportClusterNetworkPolicyNamedPorts"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for named port",
			step(muts(setNamedPort("default", egress, 3, "dns")),
				poke(cd0, "udp", hp1, 53, true),
				poke(cd1, "udp", hp1, 5353, false),
			),
		),
	}},
	{Name: "CNPBaselineTierEgressNodePeers", Manifests: []string{"base/baseline_tier/experimental-egress-selector-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy", "SupportClusterNetworkPolicyEgressNodePeers"}, Runs: []confRun{
		run("Should support an 'allow-egress' rule policy for egress-node-peer",
			step(nil,
				poke(hp0, "tcp", cen1, hostPort(0), true),
				poke(hp1, "tcp", cen1, hostPort(1), true),
			),
		),
		run("Should support a 'deny-egress' rule policy for egress-node-peer",
			step(nil,
				poke(hp1, "udp", cen1, hostPort(4), false),
				poke(hp1, "sctp", cen1, hostPort(6), false),
			),
		),
	}},
	{Name: "CNPBaselineTierIngressNamedPort", Manifests: []string{"base/baseline_tier/standard-ingress-tcp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy", "SupportClusterNetworkPolicyNamedPorts"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for named port",
			step(muts(setNamedPort("default", ingress, 3, "web")),
				poke(cd0, "tcp", hp1, 80, true),
				poke(cd1, "tcp", hp1, 8080, false),
			),
		),
	}},
	{Name: "CNPBaselineTierEgressInlineCIDRPeers", Manifests: []string{"base/baseline_tier/standard-egress-inline-cidr-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support a 'deny-egress' rule policy for egress-cidr-peer",
			step(nil,
				poke(hp1, "tcp", ll0, 80, false),
				poke(hp1, "udp", ll0, 53, false),
				poke(hp1, "sctp", ll0, 9003, false),
				poke(hp1, "tcp", cd0, 80, false),
				poke(hp1, "udp", cd0, 53, false),
				poke(hp1, "sctp", cd0, 9003, false),
				poke(hp1, "tcp", dm0, 80, true),
				poke(hp1, "udp", dm0, 53, true),
				poke(hp1, "sctp", dm0, 9003, true),
			),
			step(muts(setNamespaceLabels("slytherin", map[string]string{"conformance-house": "denied-namespace-label"})),
				poke(hp1, "tcp", dm0, 80, false),
				poke(hp1, "udp", dm0, 53, false),
				poke(hp1, "sctp", dm0, 9003, false),
			),
			step(muts(setNamespaceLabels("slytherin", map[string]string{"conformance-house": "slytherin"})),
				poke(hp1, "tcp", dm0, 80, true),
				poke(hp1, "udp", dm0, 53, true),
				poke(hp1, "sctp", dm0, 9003, true),
			),
		),
		run("Should support an 'allow-egress' rule policy for egress-cidr-peer",
			step(muts(prependNetworksRule("default", "allow-egress-to-specific-podIPs", ll0, cd0)),
				poke(hp1, "tcp", ll0, 80, true),
				poke(hp1, "udp", ll0, 53, true),
				poke(hp1, "sctp", ll0, 9003, true),
				poke(hp1, "tcp", cd0, 80, true),
				poke(hp1, "udp", cd0, 53, true),
				poke(hp1, "sctp", cd0, 9003, true),
				poke(hp1, "tcp", ll1, 80, false),
				poke(hp1, "udp", ll1, 53, false),
				poke(hp1, "sctp", ll1, 9003, false),
				poke(hp1, "tcp", cd1, 80, false),
				poke(hp1, "udp", cd1, 53, false),
				poke(hp1, "sctp", cd1, 9003, false),
			),
		),
	}},
	{Name: "CNPBaselineTierEgressSCTP", Manifests: []string{"base/baseline_tier/standard-egress-sctp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for SCTP protocol; ensure rule ordering is respected",
			step(nil,
				poke(ll0, "sctp", hp0, 9003, true),
				poke(ll1, "sctp", hp0, 9005, true),
			),
		),
		run("Should support an 'allow-egress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(ll0, "sctp", cd1, 9003, true),
				poke(ll1, "sctp", cd1, 9005, false),
			),
		),
		run("Should support an 'deny-egress' policy for SCTP protocol; ensure rule ordering is respected",
			step(muts(swapRules("default", egress, 0, 1)),
				poke(ll0, "sctp", hp1, 9003, false),
				poke(ll1, "sctp", hp1, 9005, false),
			),
		),
		run("Should support a 'deny-egress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(ll0, "sctp", dm0, 9003, false),
				poke(ll1, "sctp", dm0, 9005, true),
			),
		),
	}},
	{Name: "CNPBaselineTierEgressTCP", Manifests: []string{"base/baseline_tier/standard-egress-tcp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for TCP protocol; ensure rule ordering is respected",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", ll0, 8080, true),
			),
		),
		run("Should support an 'allow-egress' policy for TCP protocol at the specified port",
			step(nil,
				poke(hp0, "tcp", cd1, 8080, true),
				poke(hp1, "tcp", cd1, 80, false),
			),
		),
		run("Should not affect ingress traffic when only egress rules are specified",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(dm0, "tcp", hp1, 80, true),
			),
		),
		run("Should support an 'deny-egress' policy for TCP protocol; ensure rule ordering is respected",
			step(muts(swapRules("default", egress, 0, 1)),
				poke(hp0, "tcp", ll1, 80, false),
				poke(hp1, "tcp", ll1, 8080, false),
			),
		),
		run("Should support a 'deny-egress' policy for TCP protocol at the specified port",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, true),
			),
		),
	}},
	{Name: "CNPBaselineTierEgressUDP", Manifests: []string{"base/baseline_tier/standard-egress-udp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-egress' policy for UDP protocol; ensure rule ordering is respected",
			step(nil,
				poke(cd0, "udp", ll0, 53, true),
				poke(cd1, "udp", ll0, 5353, true),
			),
		),
		run("Should support an 'allow-egress' policy for UDP protocol at the specified port",
			step(nil,
				poke(cd0, "udp", hp1, 53, true),
				poke(cd1, "udp", hp1, 5353, false),
			),
		),
		run("Should support an 'deny-egress' policy for UDP protocol; ensure rule ordering is respected",
			step(muts(swapRules("default", egress, 0, 1)),
				poke(cd0, "udp", ll1, 53, false),
				poke(cd1, "udp", ll1, 5353, false),
			),
		),
		run("Should support a 'deny-egress' policy for UDP protocol at the specified port",
			step(nil,
				poke(cd0, "udp", dm0, 5353, false),
				poke(cd1, "udp", dm0, 53, true),
			),
		),
	}},
	{Name: "CNPBaselineTierGress", Manifests: []string{"base/baseline_tier/standard-gress-rules-combined.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-gress' policy across different protocols",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "udp", ll0, 53, true),
				poke(hp0, "sctp", ll0, 9003, true),
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll1, "udp", hp0, 53, true),
				poke(ll1, "sctp", hp0, 9003, true),
			),
		),
		run("Should support an 'allow-gress' policy across different protocols at the specified ports",
			step(nil,
				poke(hp0, "tcp", cd1, 8080, true),
				poke(hp1, "tcp", cd1, 80, false),
				poke(hp0, "udp", cd1, 5353, true),
				poke(hp1, "udp", cd1, 53, false),
				poke(hp0, "sctp", cd1, 9003, true),
				poke(hp1, "sctp", cd1, 9005, false),
				poke(cd0, "tcp", hp1, 80, true),
				poke(cd1, "tcp", hp1, 8080, false),
				poke(cd0, "udp", hp1, 5353, true),
				poke(cd1, "udp", hp1, 53, false),
				poke(cd0, "sctp", hp1, 9003, true),
				poke(cd1, "sctp", hp1, 9005, false),
			),
		),
		run("Should support an 'deny-gress' policy across different protocols",
			step(muts(swapRules("default", egress, 0, 1), swapRules("default", ingress, 0, 1)),
				poke(hp0, "tcp", ll1, 80, false),
				poke(hp1, "udp", ll1, 53, false),
				poke(hp0, "sctp", ll1, 9003, false),
				poke(ll0, "tcp", hp1, 80, false),
				poke(ll1, "udp", hp1, 53, false),
				poke(ll1, "sctp", hp1, 9003, false),
			),
		),
		run("Should support a 'deny-gress' policy across different protocols at the specified ports",
			step(nil,
				poke(hp0, "tcp", dm0, 80, false),
				poke(hp1, "tcp", dm0, 8080, true),
				poke(hp0, "udp", dm0, 53, false),
				poke(hp1, "udp", dm0, 5353, true),
				poke(hp0, "sctp", dm0, 9003, false),
				poke(hp1, "sctp", dm0, 9005, true),
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, true),
				poke(dm0, "udp", hp0, 53, false),
				poke(dm1, "udp", hp0, 5353, true),
				poke(dm0, "sctp", hp0, 9003, false),
				poke(dm1, "sctp", hp0, 9005, true),
			),
		),
	}},
	{Name: "CNPBaselineTierIngressSCTP", Manifests: []string{"base/baseline_tier/standard-ingress-sctp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for SCTP protocol; ensure rule ordering is respected",
			step(nil,
				poke(hp0, "sctp", ll0, 9003, true),
				poke(hp1, "sctp", ll0, 9005, true),
			),
		),
		run("Should support an 'allow-ingress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(cd0, "sctp", ll1, 9003, true),
				poke(cd1, "sctp", ll1, 9005, false),
			),
		),
		run("Should support an 'deny-ingress' policy for SCTP protocol; ensure rule ordering is respected",
			step(muts(swapRules("default", ingress, 0, 1)),
				poke(hp0, "sctp", ll1, 9003, false),
				poke(hp1, "sctp", ll1, 9005, false),
			),
		),
		run("Should support a 'deny-ingress' policy for SCTP protocol at the specified port",
			step(nil,
				poke(dm0, "sctp", ll0, 9003, false),
				poke(dm1, "sctp", ll0, 9005, true),
			),
		),
	}},
	{Name: "CNPBaselineTierIngressTCP", Manifests: []string{"base/baseline_tier/standard-ingress-tcp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for TCP protocol; ensure rule ordering is respected",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll1, "tcp", hp0, 8080, true),
			),
		),
		run("Should support an 'allow-ingress' policy for TCP protocol at the specified port",
			step(nil,
				poke(cd0, "tcp", hp1, 80, true),
				poke(cd1, "tcp", hp1, 8080, false),
			),
		),
		run("Should not affect egress traffic when only ingress rules are specified",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", dm0, 80, true),
			),
		),
		run("Should support an 'deny-ingress' policy for TCP protocol; ensure rule ordering is respected",
			step(muts(swapRules("default", ingress, 0, 1)),
				poke(ll0, "tcp", hp1, 80, false),
				poke(ll1, "tcp", hp1, 8080, false),
			),
		),
		run("Should support a 'deny-ingress' policy for TCP protocol at the specified port",
			step(nil,
				poke(dm0, "tcp", hp0, 80, false),
				poke(dm1, "tcp", hp0, 8080, true),
			),
		),
	}},
	{Name: "CNPBaselineTierIngressUDP", Manifests: []string{"base/baseline_tier/standard-ingress-udp-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support an 'allow-ingress' policy for UDP protocol; ensure rule ordering is respected",
			step(nil,
				poke(ll0, "udp", cd0, 53, true),
				poke(ll1, "udp", cd0, 5353, true),
			),
		),
		run("Should support an 'allow-ingress' policy for UDP protocol at the specified port",
			step(nil,
				poke(hp0, "udp", cd1, 53, true),
				poke(hp1, "udp", cd1, 5353, false),
			),
		),
		run("Should support an 'deny-ingress' policy for UDP protocol; ensure rule ordering is respected",
			step(muts(swapRules("default", ingress, 0, 1)),
				poke(ll0, "udp", cd1, 53, false),
				poke(ll1, "udp", cd1, 5353, false),
			),
		),
		run("Should support a 'deny-ingress' policy for UDP protocol at the specified port",
			step(nil,
				poke(dm0, "udp", cd0, 5353, false),
				poke(dm1, "udp", cd0, 53, true),
			),
		),
	}},
	{Name: "CNPBaselineTierPodSelector", Manifests: []string{"base/baseline_tier/standard-pod-selector-rules.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support pod selectors in egress peers",
			step(nil,
				poke(hp0, "tcp", ll0, 8080, false),
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp1, "tcp", ll1, 80, false),
			),
		),
		run("Should support pod selectors in ingress peers",
			step(nil,
				poke(dm1, "tcp", hp1, 80, false),
				poke(dm0, "tcp", hp0, 80, true),
			),
			step(muts(setPodLabel(cd0, conformanceRole, "blocked")),
				poke(cd0, "tcp", hp0, 80, false),
				poke(cd1, "tcp", hp0, 80, true),
			),
			step(muts(removePodLabel(cd0, conformanceRole)),
				poke(cd0, "tcp", hp0, 80, true),
			),
			step(muts(setPodLabel(cd1, conformanceRole, "blocked")),
				poke(cd1, "tcp", hp0, 80, false),
			),
			cleanup(removePodLabel(cd0, conformanceRole), removePodLabel(cd1, conformanceRole)),
		),
		run("Should support pod selectors in the subject",
			step(nil,
				poke(dm0, "tcp", ll1, 80, true),
			),
			step(muts(setPodLabel(ll0, conformanceRole, "restricted")),
				poke(ll0, "tcp", dm0, 80, false),
				poke(ll1, "tcp", dm0, 80, true),
			),
			step(muts(removePodLabel(ll0, conformanceRole)),
				poke(ll0, "tcp", dm0, 80, true),
			),
			step(muts(setPodLabel(ll1, conformanceRole, "restricted")),
				poke(ll1, "tcp", dm0, 80, false),
			),
			cleanup(removePodLabel(ll0, conformanceRole), removePodLabel(ll1, conformanceRole)),
		),
	}},
	{Name: "CNPBaselineTierPortRange", Manifests: []string{"base/baseline_tier/standard-port-range-rules-combined.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should support egress port range rules across different protocols",
			step(nil,
				poke(hp0, "tcp", ll0, 80, true),
				poke(hp0, "tcp", ll0, 8080, true),
				poke(hp1, "udp", ll0, 53, false),
				poke(hp0, "udp", cd0, 53, true),
				poke(hp0, "udp", cd0, 5353, true),
				poke(hp1, "tcp", cd0, 80, false),
				poke(hp0, "sctp", dm0, 9003, true),
				poke(hp0, "sctp", dm0, 9005, true),
				poke(hp1, "tcp", dm0, 80, false),
			),
		),
		run("Should support ingress port range rules across different protocols",
			step(nil,
				poke(ll0, "tcp", hp0, 80, true),
				poke(ll0, "tcp", hp0, 8080, true),
				poke(ll1, "udp", hp0, 53, false),
				poke(cd0, "udp", hp0, 53, true),
				poke(cd0, "udp", hp0, 5353, true),
				poke(cd1, "tcp", hp0, 80, false),
				poke(dm0, "sctp", hp0, 9003, true),
				poke(dm0, "sctp", hp0, 9005, true),
				poke(dm1, "tcp", hp0, 80, false),
			),
		),
	}},
	{Name: "CNPBaselineTierSamePriority", Manifests: []string{"base/baseline_tier/standard-same-priority.yaml"}, Features: []string{"SupportClusterNetworkPolicy"}, Runs: []confRun{
		run("Should deny traffic in both directions for each same-priority policy",
			step(nil,
				poke(dm0, "tcp", hp1, 80, false),
				poke(hp0, "tcp", dm1, 80, false),
				poke(cd0, "tcp", hp1, 80, false),
				poke(hp1, "tcp", cd1, 80, false),
				poke(dm1, "tcp", cd1, 8080, false),
				poke(cd1, "tcp", dm1, 8080, false),
			),
		),
		run("Should not apply one same-priority policy's rules to another policy's subject",
			step(nil,
				poke(dm0, "tcp", hp1, 8080, true),
				poke(hp0, "tcp", dm1, 8080, true),
				poke(dm1, "tcp", cd1, 80, true),
				poke(cd0, "tcp", dm1, 80, true),
			),
		),
		run("Should not affect traffic matching no same-priority policy",
			step(nil,
				poke(ll0, "tcp", hp1, 80, true),
				poke(hp0, "tcp", ll1, 80, true),
			),
		),
	}},
}
