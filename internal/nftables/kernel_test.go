package nftables

import (
	"context"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
)

// inFreshNetNS runs fn in a new, empty network namespace (see testbed.InFreshNetNS).
func inFreshNetNS(t *testing.T, fn func()) {
	t.Helper()
	kerneltest.InFreshNetNS(t, fn, "nft")
}

func stateWithPods(n int) *cluster.State {
	st := cluster.NewState()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	cluster.DefaultNamespace(ns)
	st.Namespaces["a"] = ns
	for i := 0; i < n; i++ {
		ip := "10.0.0." + string(rune('1'+i))
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p" + string(rune('a'+i)), Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{NodeName: "n1"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}, {IP: "fd00::" + string(rune('1'+i))}}},
		}
		st.Pods.Set(cluster.Key("a", p.Name), cluster.PodOf(p))
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}, {IPBlock: &networkingv1.IPBlock{CIDR: "fd00:1::/64", Except: []string{"fd00:1::/80"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &intstr.IntOrString{IntVal: 80}}, {Port: &intstr.IntOrString{Type: intstr.String, StrVal: "http"}}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{}},
		},
	}
	cluster.DefaultNetworkPolicy(np)
	st.Policies["a/web"] = np
	return st
}

func TestKernelFullIncrementalVerifyCleanup(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		rs, _ := policy.Compile(stateWithPods(2), "n1")
		res, err := b.FullSync(ctx, rs)
		if err != nil {
			t.Fatalf("full sync: %v", err)
		}
		if !res.Full || res.Operations == 0 {
			t.Fatalf("full sync result %+v", res)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after full sync: %v", err)
		}

		// Unchanged state sends nothing.
		if res, err := b.Sync(ctx, rs); err != nil || res.Operations != 0 {
			t.Fatalf("no-op sync: %+v %v", res, err)
		}
		// One more pod: a handful of element adds, no chain rewrite.
		rs3, _ := policy.Compile(stateWithPods(3), "n1")
		res, err = b.Sync(ctx, rs3)
		if err != nil || res.Full || res.Operations == 0 || res.Operations > 6 {
			t.Fatalf("incremental sync: %+v %v", res, err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after incremental sync: %v", err)
		}
		// Back to two pods, then drop the policy entirely: chains and sets are removed.
		if _, err := b.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		empty := stateWithPods(2)
		delete(empty.Policies, "a/web")
		rsEmpty, _ := policy.Compile(empty, "n1")
		if _, err := b.Sync(ctx, rsEmpty); err != nil {
			t.Fatalf("removing policy: %v", err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after removal: %v", err)
		}
		out, _ := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
		if strings.Contains(string(out), "/a/web") {
			t.Fatalf("policy chain left behind:\n%s", out)
		}
		if _, err := b.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}

		// Someone else's edits are detected.
		for _, edit := range []string{
			"flush chain inet netwarden in/a/web-v4",
			"delete element inet netwarden dispatch-in-v4 { 10.0.0.1 }",
			"add rule inet netwarden forward-ingress accept",
			"delete table inet netwarden",
		} {
			if out, err := exec.Command("nft", edit).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", edit, err, out)
			}
			if err := b.Verify(ctx); err == nil {
				t.Fatalf("verify did not notice %q", edit)
			}
			if _, err := b.FullSync(ctx, rs); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(ctx); err != nil {
				t.Fatalf("verify after repair of %q: %v", edit, err)
			}
		}
		// An in-place edit that keeps every count is caught by the digest.
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		rules, err := exec.Command("nft", "-a", "list", "chain", "inet", TableName, "forward-ingress").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		handle := ""
		for _, line := range strings.Split(string(rules), "\n") {
			if strings.Contains(line, "ip daddr vmap") {
				handle = line[strings.LastIndex(line, " ")+1:]
			}
		}
		if out, err := exec.Command("nft", "replace", "rule", "inet", TableName, "forward-ingress", "handle", handle, "ip", "daddr", "10.9.9.9", "accept").CombinedOutput(); err != nil {
			t.Fatalf("replace: %v %s", err, out)
		}
		if err := b.Verify(ctx); err == nil {
			t.Fatal("verify did not notice an in-place rule replacement")
		}
		// So is an element replaced by another.
		if _, err := b.FullSync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		var set, elem string
		for _, name := range slices.Sorted(maps.Keys(b.applied.Sets)) {
			if s := b.applied.Sets[name]; strings.HasPrefix(name, "pods-") && strings.HasSuffix(name, "-v4") && s.Count() > 0 {
				set, elem = name, s.Keys()[0]
				break
			}
		}
		if set == "" {
			t.Fatalf("no IPv4 peer set with elements among %v", slices.Sorted(maps.Keys(b.applied.Sets)))
		}
		for _, edit := range [][]string{{"delete", "element", "inet", TableName, set, "{", elem, "}"}, {"add", "element", "inet", TableName, set, "{", "192.0.2.77", "}"}} {
			if out, err := exec.Command("nft", edit...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v %s", edit, err, out)
			}
		}
		if err := b.Verify(ctx); err == nil {
			t.Fatalf("verify did not notice %s of set %s replaced by 192.0.2.77", elem, set)
		}

		if err := b.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err != nil || strings.Contains(string(out), TableName) {
			t.Fatalf("table left after cleanup: %s %v", out, err)
		}
		if err := b.Cleanup(ctx); err != nil {
			t.Fatalf("cleanup must be idempotent: %v", err)
		}
	})
}

// TestNetlinkAndCLIProgramTheSameTable checks that an incremental sync over netlink leaves
// exactly the table a full sync through nft writes for the same state, with drop logging off
// and on (the log rules have both encodings too).
func TestNetlinkAndCLIProgramTheSameTable(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testNetlinkAndCLI(t, nil) })
	t.Run("log-drops+counters", func(t *testing.T) { testNetlinkAndCLI(t, &policy.DropLog{Group: 7, Rate: 10, Burst: 20}) })
}

func testNetlinkAndCLI(t *testing.T, log *policy.DropLog) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		b.SetDropLog(log)
		b.SetPolicyCounters(log != nil)
		base := stateWithPods(3)
		rs, _ := policy.Compile(base, "n1")
		if _, err := b.FullSync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		next := stateWithPods(3)
		sctp, udp := corev1.ProtocolSCTP, corev1.ProtocolUDP
		end := int32(9000)
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "more"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					// The ipBlock is a/web's, so its set exists and the change stays netlinkable.
					From: []networkingv1.NetworkPolicyPeer{
						{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"x": "y"}}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:1::/64", Except: []string{"fd00:1::/80"}}},
						// New ipBlocks: new interval sets, written over netlink as nft writes them
						// (a gap, adjacent ranges, a single address).
						{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.64/26"}}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "198.51.100.7/32"}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8::/32", Except: []string{"2001:db8::/34"}}},
					},
					Ports: []networkingv1.NetworkPolicyPort{
						{Protocol: &udp, Port: &intstr.IntOrString{IntVal: 53}},
						{Protocol: &udp, Port: &intstr.IntOrString{IntVal: 8000}, EndPort: &end},
						{Protocol: &sctp},
						{Protocol: &sctp, Port: &intstr.IntOrString{Type: intstr.String, StrVal: "sig"}},
					},
				}},
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &intstr.IntOrString{Type: intstr.String, StrVal: "http"}}},
				}, {}},
			},
		}
		cluster.DefaultNetworkPolicy(np)
		next.Policies["a/more"] = np
		p := *next.Pods.Get("a/pb")
		p.Ports = []cluster.ContainerPort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}
		next.Pods.Set("a/pb", &p)
		rs2, _ := policy.Compile(next, "n1")
		r2 := (&Renderer{log: log, counters: log != nil}).Render(rs2)
		if p := diff(b.applied, r2); !p.netlinkable(r2) || len(p.newChains) == 0 {
			t.Fatalf("expected a structural netlink plan, got %+v", p)
		}
		if res, err := b.Sync(ctx, rs2); err != nil || res.Full {
			t.Fatalf("netlink sync: %+v %v (a full sync means the netlink batch failed)", res, err)
		}
		viaNetlink, viaNetlinkExprs, viaNetlinkElems := listCanonical(t), ruleExprs(t), setElements(t)
		if hasLog := strings.Contains(viaNetlinkExprs, "[ log prefix nw:g-") && strings.Contains(viaNetlinkExprs, "[ counter "); hasLog != (log != nil) {
			t.Fatalf("log expressions present: %v, want %v:\n%s", hasLog, log != nil, viaNetlinkExprs)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatalf("verify after netlink sync: %v", err)
		}
		b.netlink = false // the full syncs that follow go through nft
		if _, err := b.FullSync(ctx, rs2); err != nil {
			t.Fatal(err)
		}
		viaCLI := listCanonical(t)
		if viaNetlink != viaCLI {
			t.Fatalf("tables differ.\nnetlink:\n%s\nnft:\n%s", viaNetlink, viaCLI)
		}
		// The listing hides dependencies and how a match is encoded; the rules' kernel
		// expressions must be the same as well.
		if viaCLIExprs := ruleExprs(t); viaNetlinkExprs != viaCLIExprs {
			t.Fatalf("rule expressions differ.\nnetlink:\n%s\nnft:\n%s", viaNetlinkExprs, viaCLIExprs)
		}
		// Nor does it show how an interval set's ranges are stored.
		if viaCLIElems := setElements(t); viaNetlinkElems != viaCLIElems {
			t.Fatalf("set elements differ.\nnetlink:\n%s\nnft:\n%s", viaNetlinkElems, viaCLIElems)
		}
		if !strings.Contains(viaNetlinkElems, "element 000200c0 : 0 [end]") {
			t.Fatalf("the new ipBlock set is missing from the kernel's elements:\n%s", viaNetlinkElems)
		}
		// And back: removing the policy over netlink leaves what a full sync leaves.
		b.netlink = true
		if res, err := b.Sync(ctx, rs); err != nil || res.Full {
			t.Fatalf("netlink removal: %+v %v", res, err)
		}
		back := listCanonical(t)
		b.netlink = false
		if _, err := b.FullSync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		if full := listCanonical(t); back != full {
			t.Fatalf("tables differ after removal.\nnetlink:\n%s\nnft:\n%s", back, full)
		}
	})
}

// ruleExprs lists the kernel expressions of every rule in the table, grouped by chain with the
// chains sorted, from nft's netlink debug output. Handles are left out: they differ between
// two ways of writing the same table.
func ruleExprs(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "--debug=netlink", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	chains := map[string][]string{}
	var chain string
	var rule []string
	flush := func() {
		if chain != "" && len(rule) > 0 {
			chains[chain] = append(chains[chain], strings.Join(rule, "\n"))
		}
		chain, rule = "", nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		switch f := strings.Fields(line); {
		case len(f) >= 4 && f[0] == "inet" && f[1] == TableName && !strings.HasPrefix(f[2], "@"):
			flush()
			chain = f[2]
		case chain != "" && strings.HasPrefix(strings.TrimSpace(line), "["):
			rule = append(rule, strings.TrimSpace(line))
		default:
			flush()
		}
	}
	flush()
	if len(chains) == 0 {
		t.Fatalf("no rules in the netlink debug listing:\n%s", out)
	}
	var blocks []string
	for _, name := range slices.Sorted(maps.Keys(chains)) {
		blocks = append(blocks, name+":\n"+strings.Join(chains[name], "\n--\n"))
	}
	return strings.Join(blocks, "\n\n")
}

// setElements lists the kernel elements of every set and map in the table (key, flags, data)
// from nft's netlink debug output, by set name, each set's elements sorted.
func setElements(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "--debug=netlink", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	sets := map[string][]string{}
	var set string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "inet" && f[1] == TableName && strings.HasPrefix(f[2], "@"):
			set = f[2]
		case set != "" && len(f) > 0 && f[0] == "element":
			sets[set] = append(sets[set], strings.Join(f, " "))
		default:
			set = ""
		}
	}
	var blocks []string
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		slices.Sort(sets[name])
		blocks = append(blocks, name+":\n"+strings.Join(sets[name], "\n"))
	}
	return strings.Join(blocks, "\n\n")
}

// listCanonical lists the table with its chains and sets sorted and elements sorted, so two
// listings compare equal when they hold the same objects.
func listCanonical(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var blocks []string
	var cur []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain ") || strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "map "):
			if len(cur) > 0 {
				blocks = append(blocks, strings.Join(cur, "\n"))
			}
			cur = []string{line}
		case strings.HasPrefix(line, "elements = {"):
			inner := strings.TrimSuffix(strings.TrimPrefix(line, "elements = {"), "}")
			parts := strings.Split(inner, ",")
			for i := range parts {
				parts[i] = strings.TrimSpace(parts[i])
			}
			sort.Strings(parts)
			cur = append(cur, "elements = "+strings.Join(parts, ","))
		case line != "" && line != "}":
			cur = append(cur, line)
		}
	}
	blocks = append(blocks, strings.Join(cur, "\n"))
	sort.Strings(blocks)
	return strings.Join(blocks, "\n\n")
}

// TestKernelLongPolicyNames: the longest namespace and policy names the API server accepts
// make a policy chain whose name is cut and completed with a hash. nft must parse it, in a
// full sync and in a change after it, and policies whose names differ only past the cut keep
// chains of their own.
func TestKernelLongPolicyNames(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		st := stateWithPods(2)
		long := strings.Repeat("n", 63)
		name := strings.Repeat(strings.Repeat("p", 63)+".", 3) + strings.Repeat("p", 61)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: long}}
		cluster.DefaultNamespace(ns)
		st.Namespaces[long] = ns
		np := st.Policies["a/web"].DeepCopy()
		np.Namespace, np.Name = long, name
		if errs := cluster.ValidateNetworkPolicy(np); len(errs) > 0 {
			t.Fatalf("the test's policy is invalid: %v", errs)
		}
		st.Policies = map[string]*networkingv1.NetworkPolicy{cluster.Key(long, name): np}
		pods := st.Pods
		st.Pods = &cluster.PodMap{}
		for _, p := range pods.All() {
			c := *p
			c.Namespace = long
			st.Pods.Set(cluster.Key(long, p.Name), &c)
		}
		rs, _ := policy.Compile(st, "n1")
		if len(rs.Policies) != 2 {
			t.Fatalf("want the policy's two directions compiled, got %d", len(rs.Policies))
		}
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.FullSync(ctx, rs); err != nil {
			t.Fatalf("full sync: %v", err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		// A second policy with a name that differs only past the cut gets its own chains.
		np2 := np.DeepCopy()
		np2.Name = name[:len(name)-1] + "q"
		np2.Spec.Ingress = nil
		st.Policies[cluster.Key(long, np2.Name)] = np2
		rs2, _ := policy.Compile(st, "n1")
		if len(rs2.Policies) != 4 {
			t.Fatalf("names that differ past the cut share a chain: %v", slices.Collect(maps.Keys(rs2.Policies)))
		}
		res, err := b.Sync(ctx, rs2)
		if err != nil || res.Fallback != "" {
			t.Fatalf("sync of a second long-named policy: %+v %v", res, err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
		if err != nil {
			t.Fatalf("%v %s", err, out)
		}
		for chain := range rs2.Policies {
			if !strings.Contains(string(out), "chain "+chain+"-v4 {") {
				t.Errorf("chain %s-v4 missing from the table:\n%s", chain, out)
			}
		}
	})
}

// TestKernelWholeFamilyIPBlock: ipBlocks of 0.0.0.0/0 and ::/0, alone and with excepts, in a
// full sync and in a change after it; the kernel holds exactly their prefixes (Verify counts
// the elements of every set), and an excepted address is not in its set.
func TestKernelWholeFamilyIPBlock(t *testing.T) {
	inFreshNetNS(t, func() {
		ctx := context.Background()
		st := stateWithPods(2)
		np := st.Policies["a/web"]
		np.Spec.Ingress[0].From = append(np.Spec.Ingress[0].From,
			networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}},
			networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: []string{"fd00::1/128", "9000::/4"}}})
		rs, _ := policy.Compile(st, "n1")
		b, err := New()
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.FullSync(ctx, rs)
		if err != nil {
			t.Fatalf("full sync: %v", err)
		}
		// Netlink cannot write a range up to the highest address as nft does; nft can.
		if !strings.Contains(res.Fallback, "highest address") {
			t.Fatalf("full sync %+v: want it to go through nft, for the ranges reaching the highest address", res)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		np = np.DeepCopy()
		np.Spec.Ingress[0].From = append(np.Spec.Ingress[0].From,
			networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.1/32"}}},
			networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::/0"}})
		st.Policies["a/web"] = np
		rs2, _ := policy.Compile(st, "n1")
		if res, err := b.Sync(ctx, rs2); err != nil || res.Full || res.Fallback != "" {
			t.Fatalf("incremental sync: %+v %v", res, err)
		}
		if err := b.Verify(ctx); err != nil {
			t.Fatal(err)
		}
		// Every set of the ipBlocks, and for each whether it holds 10.0.0.1, fd00::1, fd00::2.
		var got []string
		for _, name := range slices.Sorted(maps.Keys(rs2.CIDRSets)) {
			var in []string
			for _, a := range []string{"10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2", "9000::1"} {
				if netip.MustParseAddr(a).Is6() != rs2.CIDRSets[name].IPv6 {
					continue
				}
				if exec.Command("nft", "get", "element", "inet", TableName, name, "{ "+a+" }").Run() == nil {
					in = append(in, a)
				}
			}
			got = append(got, strings.Join(in, ","))
		}
		slices.Sort(got)
		// fd00:1::/64 minus fd00:1::/80, 0.0.0.0/0, 0.0.0.0/0 minus 10.0.0.1, ::/0, ::/0 minus
		// fd00::1 and 9000::/4.
		want := []string{"", "10.0.0.1,10.0.0.2", "10.0.0.2", "fd00::1,fd00::2,9000::1", "fd00::2"}
		if !slices.Equal(got, want) {
			t.Fatalf("members %q, want %q", got, want)
		}
	})
}
