package conformance

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/testkit/minicluster"
)

const (
	agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.53"
	servePort    = 8080
	hostNetPort  = 34400
)

// TestServicePaths sends connections along the paths Services take, through the real
// kube-proxy of each node (in the mode of netwarden's kernel interface) and the EndpointSlices
// of the real controller manager, and checks each verdict against the policies of the pod the
// connection reaches. Every Service selects one pod, so the endpoint reached is known.
//
//	s1 (node-1)  NetworkPolicy: none;  ClusterNetworkPolicy (admin): deny ingress from c2
//	s2 (node-2)  NetworkPolicy: ingress from c1, and from the underlay's address (an outside client)
//	c1 (node-1)  NetworkPolicy: ingress from c1 only (its own Service: hairpin)
//	c2 (node-2)  none
//	h  (node-1)  hostNetwork server
func TestServicePaths(t *testing.T) {
	requireCluster(t)
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			c := startCluster(t, backend)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			began := time.Now()
			ns := "paths"
			mustCreate(t, func() error {
				_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
				return err
			})
			for _, p := range []struct {
				name, node string
				host       bool
			}{{"s1", "node-1", false}, {"s2", "node-2", false}, {"c1", "node-1", false}, {"c2", "node-2", false}, {"h", "node-1", true}} {
				mustCreate(t, func() error {
					_, err := c.Client.CoreV1().Pods(ns).Create(ctx, serverPod(p.name, p.node, p.host), metav1.CreateOptions{})
					return err
				})
				port := servePort
				if p.host {
					port = hostNetPort
				}
				mustCreate(t, func() error {
					_, err := c.Client.CoreV1().Services(ns).Create(ctx, service(p.name, port, ""), metav1.CreateOptions{})
					return err
				})
			}
			for _, etp := range []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal} {
				mustCreate(t, func() error {
					_, err := c.Client.CoreV1().Services(ns).Create(ctx, service("s2", servePort, etp), metav1.CreateOptions{})
					return err
				})
			}
			mustCreate(t, func() error { return createPolicies(ctx, c, ns) })
			pods := waitPodsReady(t, ctx, c, ns, 5)
			svcs, err := c.Client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			clusterIP, nodePort := map[string]string{}, map[string]int32{}
			for _, s := range svcs.Items {
				clusterIP[s.Name] = s.Spec.ClusterIP
				if s.Spec.Type == corev1.ServiceTypeNodePort {
					nodePort[s.Name] = s.Spec.Ports[0].NodePort
				}
			}
			node := func(name string) string { return c.Node(name).IP.String() }
			fromPod := func(pod string) func(string) error {
				return func(addr string) error {
					_, stderr, err := c.Exec(ctx, ns, pod, "serve", "/agnhost", "connect", addr, "--timeout=2s", "--protocol=tcp")
					if err != nil {
						return fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr))
					}
					return nil
				}
			}
			fromOutside := func(addr string) error {
				d, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				conn, err := c.DialUnderlay(d, addr)
				if err != nil {
					return err
				}
				// An accepted connection that policy drops after the handshake never happens, but a
				// reply must come: serve-hostname answers with the pod's name.
				conn.SetDeadline(time.Now().Add(2 * time.Second))
				buf := make([]byte, 64)
				n, err := conn.Read(buf)
				conn.Close()
				if n == 0 {
					return fmt.Errorf("no answer: %v", err)
				}
				return nil
			}
			hp := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
			cases := []struct {
				path  string
				dial  func(string) error
				addr  string
				allow bool
			}{
				{"c1 → ClusterIP → s1, same node", fromPod("c1"), hp(clusterIP["s1"], 80), true},
				{"c2 → ClusterIP → s1, other node, admin tier denies", fromPod("c2"), hp(clusterIP["s1"], 80), false},
				{"c1 → ClusterIP → s2, other node, allowed by s2's policy", fromPod("c1"), hp(clusterIP["s2"], 80), true},
				{"c2 → ClusterIP → s2, same node, isolated", fromPod("c2"), hp(clusterIP["s2"], 80), false},
				{"c1 → its own ClusterIP (hairpin), from itself", fromPod("c1"), hp(clusterIP["c1"], 80), true},
				{"c2 → ClusterIP → c1, isolated", fromPod("c2"), hp(clusterIP["c1"], 80), false},
				{"c1 → ClusterIP → hostNetwork h on its node, c1 isolated for ingress", fromPod("c1"), hp(clusterIP["h"], 80), true},
				{"outside → NodePort of node-2, Local: the client's address is allowed", fromOutside, hp(node("node-2"), int(nodePort["s2-local"])), true},
				{"outside → NodePort of node-2, Cluster, endpoint on the receiving node", fromOutside, hp(node("node-2"), int(nodePort["s2-cluster"])), true},
				{"outside → NodePort of node-1, Cluster: node-1's address reaches s2, not allowed", fromOutside, hp(node("node-1"), int(nodePort["s2-cluster"])), false},
				{"c1 → NodePort of node-2, Cluster → s2", fromPod("c1"), hp(node("node-2"), int(nodePort["s2-cluster"])), true},
			}
			var failed int
			for _, tc := range cases {
				if err := waitVerdict(ctx, tc.dial, tc.addr, tc.allow); err != nil {
					failed++
					t.Errorf("%s (%s): %v", tc.path, tc.addr, err)
				}
			}
			addSummary("Service paths (kube-proxy "+string(modeOf(backend))+")", backend, len(cases)-failed, failed, 0, time.Since(began))
			if t.Failed() {
				t.Logf("pods: %v", pods)
			}
			// On the same cluster: the cluster DNS behind its Service, for domainNames peers.
			t.Run("domain names through the kube-dns Service", func(t *testing.T) {
				began := time.Now()
				checkDomainNames(t, ctx, c)
				passed, failed := 1, 0
				if t.Failed() {
					passed, failed = 0, 1
				}
				addSummary("domainNames, kube-proxy "+string(modeOf(backend)), backend, passed, failed, 0, time.Since(began))
			})
		})
	}
}

// waitVerdict probes until the verdict is the expected one, then probes again: an allowed
// connection must keep working, a denied one must stay denied (a sync in between would show).
func waitVerdict(ctx context.Context, dial func(string) error, addr string, allow bool) error {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for {
		last = dial(addr)
		if (last == nil) == allow {
			if again := dial(addr); (again == nil) != allow {
				return fmt.Errorf("verdict changed between two probes: %v, then %v", last, again)
			}
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if allow {
				return fmt.Errorf("denied, want allowed: %v", last)
			}
			return fmt.Errorf("allowed, want denied")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func serverPod(name, node string, host bool) *corev1.Pod {
	port := servePort
	if host {
		port = hostNetPort
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"name": name}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			HostNetwork:  host,
			Containers: []corev1.Container{{
				Name: "serve", Image: agnhostImage,
				Args:  []string{"serve-hostname", "--tcp", "--http=false", "--port", strconv.Itoa(port)},
				Ports: []corev1.ContainerPort{{ContainerPort: int32(port)}},
			}},
		},
	}
}

// service selects the pod name: a ClusterIP Service on port 80, or with etp a NodePort Service
// named <name>-cluster or <name>-local.
func service(name string, port int, etp corev1.ServiceExternalTrafficPolicy) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"name": name},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt(port)}},
		},
	}
	if etp != "" {
		s.Name = name + "-" + strings.ToLower(string(etp))
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = etp
	}
	return s
}

func createPolicies(ctx context.Context, c *minicluster.Cluster, ns string) error {
	peer := func(name string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": name}}}
	}
	outside := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: minicluster.UnderlayGateway.String() + "/32"}}
	for _, np := range []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "s2"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "s2"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer("c1"), outside}}},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c1"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "c1"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer("c1")}}},
		}},
	} {
		if _, err := c.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	npa, err := npaclient.NewForConfig(c.Server.AdminConfig())
	if err != nil {
		return err
	}
	cnp := &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-c2-to-s1"},
		Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier:     npav1beta1.AdminTier,
			Priority: 10,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "s1"}},
			}},
			Ingress: []npav1beta1.ClusterNetworkPolicyIngressRule{{
				Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
				From: []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &npav1beta1.NamespacedPod{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "c2"}},
				}}},
			}},
		},
	}
	_, err = npa.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, cnp, metav1.CreateOptions{})
	return err
}

func waitPodsReady(t *testing.T, ctx context.Context, c *minicluster.Cluster, ns string, n int) map[string]string {
	t.Helper()
	var last string
	for {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			ready := map[string]string{}
			for _, p := range pods.Items {
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
						ready[p.Name] = p.Spec.NodeName + "/" + p.Status.PodIP
					}
				}
			}
			if len(ready) == n {
				return ready
			}
			last = fmt.Sprintf("%d of %d ready: %v", len(ready), n, ready)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pods of %s: %s", ns, last)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}
