package kubeapi

import (
	"encoding/json"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/randfill"

	"github.com/netwarden/netwarden/internal/cluster"
)

func fullMeta(ns, name string) metav1.ObjectMeta {
	now := metav1.Now()
	grace := int64(30)
	return metav1.ObjectMeta{
		Name:                       name,
		GenerateName:               name + "-",
		Namespace:                  ns,
		UID:                        "0b8d4f6e-uid",
		ResourceVersion:            "12345",
		Generation:                 3,
		CreationTimestamp:          now,
		DeletionTimestamp:          &now,
		DeletionGracePeriodSeconds: &grace,
		Labels:                     map[string]string{"app": "web"},
		Annotations:                map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 1000)},
		OwnerReferences:            []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-abc", UID: "rs-uid"}},
		Finalizers:                 []string{"example.com/finalizer"},
		ManagedFields:              []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1"}},
	}
}

func fullPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: fullMeta("shop", "web-abc-xyz"),
		Spec: corev1.PodSpec{
			NodeName:           "node-1",
			HostNetwork:        true,
			ServiceAccountName: "web",
			Volumes:            []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers: []corev1.Container{
				{Name: "init", Image: "busybox", Command: []string{"sh", "-c", "true"}},
				{Name: "sidecar", Image: "envoy", Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 9901, Protocol: corev1.ProtocolTCP, HostPort: 9901, HostIP: "0.0.0.0"}}},
			},
			Containers: []corev1.Container{
				{
					Name:  "nginx",
					Image: "nginx:1.27",
					Env:   []corev1.EnvVar{{Name: "A", Value: "b"}},
					Ports: []corev1.ContainerPort{
						{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP, HostPort: 8080},
						{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
					},
					Resources:    corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}},
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				},
				{Name: "logger", Image: "fluentbit"},
			},
			Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}},
		},
		Status: corev1.PodStatus{
			Phase:             corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			HostIP:            "192.168.0.10",
			HostIPs:           []corev1.HostIP{{IP: "192.168.0.10"}},
			PodIP:             "10.244.1.5",
			PodIPs:            []corev1.PodIP{{IP: "10.244.1.5"}, {IP: "fd00::5"}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "nginx", Ready: true, Image: "nginx:1.27"}},
			QOSClass:          corev1.PodQOSBurstable,
		},
	}
}

func TestTransformPod(t *testing.T) {
	in := fullPod()
	orig := in.DeepCopy()
	got, err := Transform(in)
	if err != nil {
		t.Fatal(err)
	}
	// Init containers' ports are validated, not kept: named ports resolve to those of containers.
	want := &cluster.Pod{Name: "web-abc-xyz", Namespace: "shop", ResourceVersion: "12345", Labels: map[string]string{"app": "web"},
		NodeName: "node-1", HostNetwork: true, Phase: corev1.PodRunning,
		IPs:   []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")},
		Ports: []cluster.ContainerPort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %s\nwant %s", toJSON(t, got), toJSON(t, want))
	}
	if !equality.Semantic.DeepEqual(in, orig) {
		t.Error("Transform modified its input")
	}
	if again, _ := Transform(got); again != got {
		t.Errorf("not idempotent: %s", toJSON(t, again))
	}
	bad := fullPod()
	bad.Spec.InitContainers[1].Ports[0].Name = "not_a_port_name" // the second init container, the first without ports
	inv, ok := TransformPod(bad).(*invalidObject)
	if !ok || len(inv.errs) != 1 || inv.errs[0].Field != "spec.initContainers[1].ports[0].name" {
		t.Errorf("an invalid init container port: %v, want an invalidObject naming the field", inv.errs)
	}
	if again, _ := Transform(inv); again != inv {
		t.Error("an invalid pod is transformed again")
	}
}

func TestTransformPodDefaulting(t *testing.T) {
	in := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}},
		Status:     corev1.PodStatus{PodIP: "10.0.0.1"},
	}
	got := TransformPod(in).(*cluster.Pod)
	if !slices.Equal(got.IPs, []netip.Addr{netip.MustParseAddr("10.0.0.1")}) {
		t.Errorf("podIPs: %v", got.IPs)
	}
	if p := got.Ports[0].Protocol; p != corev1.ProtocolTCP {
		t.Errorf("protocol: %q", p)
	}
	if in.Status.PodIPs != nil || in.Spec.Containers[0].Ports[0].Protocol != "" {
		t.Error("input modified")
	}
	noPorts := TransformPod(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "x"}}},
	}).(*cluster.Pod)
	if noPorts.Ports != nil {
		t.Errorf("ports of containers without ports: %+v", noPorts.Ports)
	}
}

func TestTransformNamespace(t *testing.T) {
	in := &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"},
		ObjectMeta: fullMeta("", "shop"),
		Spec:       corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{corev1.FinalizerKubernetes}},
		Status:     corev1.NamespaceStatus{Phase: corev1.NamespaceActive},
	}
	orig := in.DeepCopy()
	got, _ := Transform(in)
	want := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", UID: "0b8d4f6e-uid", ResourceVersion: "12345",
		Labels: map[string]string{"app": "web", cluster.NamespaceNameLabel: "shop"}}}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("got  %s\nwant %s", toJSON(t, got), toJSON(t, want))
	}
	if !equality.Semantic.DeepEqual(in, orig) {
		t.Error("Transform modified its input (labels added to the shared map?)")
	}
	// With the label already set (as the API server does), the labels map is shared, not copied.
	in.Labels[cluster.NamespaceNameLabel] = "shop"
	got2 := TransformNamespace(in)
	in.Labels["probe"] = "x"
	if got2.Labels["probe"] != "x" {
		t.Error("labels map copied although no defaulting was needed")
	}
}

func TestTransformNode(t *testing.T) {
	in := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: fullMeta("", "node-1"),
		Spec: corev1.NodeSpec{
			PodCIDR:    "10.244.1.0/24",
			PodCIDRs:   []string{"10.244.1.0/24", "fd00:1::/64"},
			ProviderID: "aws:///i-123",
			Taints:     []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.10"}, {Type: corev1.NodeExternalIP, Address: "203.0.113.10"},
				{Type: corev1.NodeHostName, Address: "node-1"}},
			Capacity:     corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
			Conditions:   []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Images:       []corev1.ContainerImage{{Names: []string{"nginx"}, SizeBytes: 1 << 20}},
			NodeInfo:     corev1.NodeSystemInfo{KubeletVersion: "v1.37.0"},
			VolumesInUse: []corev1.UniqueVolumeName{"vol"},
		},
	}
	got, _ := Transform(in)
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "0b8d4f6e-uid", ResourceVersion: "12345", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
		// ClusterNetworkPolicy nodes peers select by labels and match the InternalIP and
		// ExternalIP addresses.
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.10"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.10"}, {Type: corev1.NodeHostName, Address: "node-1"}}},
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("got  %s\nwant %s", toJSON(t, got), toJSON(t, want))
	}
}

func TestTransformNetworkPolicy(t *testing.T) {
	port := intstr.FromString("http")
	in := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1"},
		ObjectMeta: fullMeta("shop", "allow-web"),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}}}},
		},
	}
	orig := in.DeepCopy()
	got, _ := Transform(in)
	wantSpec := orig.Spec.DeepCopy()
	tcp := corev1.ProtocolTCP
	wantSpec.Ingress[0].Ports[0].Protocol = &tcp
	wantSpec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	want := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-web", Namespace: "shop", UID: "0b8d4f6e-uid", ResourceVersion: "12345", Labels: map[string]string{"app": "web"}},
		Spec:       *wantSpec,
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("got  %s\nwant %s", toJSON(t, got), toJSON(t, want))
	}
	if !equality.Semantic.DeepEqual(in, orig) {
		t.Error("Transform modified its input")
	}
}

func TestTransformClusterNetworkPolicy(t *testing.T) {
	in := &npav1beta1.ClusterNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{Kind: "ClusterNetworkPolicy", APIVersion: "policy.networking.k8s.io/v1beta1"},
		ObjectMeta: fullMeta("", "deny"),
		Spec: npav1beta1.ClusterNetworkPolicySpec{Tier: npav1beta1.AdminTier, Priority: 3,
			Subject: npav1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}},
		Status: npav1beta1.ClusterNetworkPolicyStatus{Conditions: []metav1.Condition{{Type: "Other", Status: metav1.ConditionTrue}}},
	}
	orig := in.DeepCopy()
	got, _ := Transform(in)
	want := &npav1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny", UID: "0b8d4f6e-uid", ResourceVersion: "12345", Generation: 3, Labels: map[string]string{"app": "web"}},
		Spec:       orig.Spec,
		Status:     orig.Status,
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("got  %s\nwant %s", toJSON(t, got), toJSON(t, want))
	}
	if !equality.Semantic.DeepEqual(in, orig) {
		t.Error("Transform modified its input")
	}

	// A change of the status alone (the agents' condition) is no change for the compiler.
	a := got.(*npav1beta1.ClusterNetworkPolicy)
	b := TransformClusterNetworkPolicy(in)
	b.ResourceVersion = "12346"
	b.Status.Conditions = []metav1.Condition{{Type: "netwarden.io/Accepted", Status: metav1.ConditionTrue}}
	if !unchanged(a, b) {
		t.Error("a status change is a change")
	}
	c := TransformClusterNetworkPolicy(in)
	c.Spec.Priority = 4
	if unchanged(a, c) {
		t.Error("a priority change is no change")
	}
}

func TestTransformTombstone(t *testing.T) {
	for _, tomb := range []any{
		cache.DeletedFinalStateUnknown{Key: "shop/web-abc-xyz", Obj: fullPod()},
		&cache.DeletedFinalStateUnknown{Key: "shop/web-abc-xyz", Obj: fullPod()},
	} {
		got, err := Transform(tomb)
		if err != nil {
			t.Fatal(err)
		}
		var inner any
		switch g := got.(type) {
		case cache.DeletedFinalStateUnknown:
			inner = g.Obj
			if g.Key != "shop/web-abc-xyz" {
				t.Errorf("key %q", g.Key)
			}
		case *cache.DeletedFinalStateUnknown:
			inner = g.Obj
		default:
			t.Fatalf("got %T", got)
		}
		if pod, ok := inner.(*cluster.Pod); !ok || pod.Name != "web-abc-xyz" {
			t.Errorf("tombstone object not transformed: %#v", inner)
		}
	}
	// Other types pass unchanged.
	svc := &corev1.Service{ObjectMeta: fullMeta("shop", "web")}
	if got, _ := Transform(svc); got != svc {
		t.Error("other type changed")
	}
}

// TestTransformKeepsOnlyAllowedFields fills every field of each type with random data and checks
// that only the allowed fields are non-empty after Transform.
func TestTransformKeepsOnlyAllowedFields(t *testing.T) {
	meta := []string{"metadata.name", "metadata.namespace", "metadata.labels", "metadata.resourceVersion", "metadata.uid"}
	ports := []string{"ports[].name", "ports[].containerPort", "ports[].protocol"}
	var podFields []string
	for _, p := range ports {
		podFields = append(podFields, "spec.containers[]."+p)
	}
	tests := []struct {
		name    string
		obj     any
		allowed []string
		// prepare, when set, makes the filled object one the agent keeps (a pod whose random
		// addresses would make it invalid).
		prepare func(obj any)
	}{
		// A pod is kept as a cluster.Pod, compared here as the corev1.Pod it stands for
		// (APIObject, which names the one container): no uid, no init containers' ports.
		{"Pod", &corev1.Pod{}, append(slices.Concat(meta[:4], podFields), "spec.containers[].name", "spec.nodeName", "spec.hostNetwork", "status.phase",
			"status.podIP", "status.podIPs[].ip"), func(obj any) {
			p := obj.(*corev1.Pod)
			p.Status.PodIP, p.Status.PodIPs = "10.0.0.1", []corev1.PodIP{{IP: "10.0.0.1"}}
		}},
		{"Namespace", &corev1.Namespace{}, meta, nil},
		{"Node", &corev1.Node{}, append(slices.Clone(meta), "spec.podCIDRs[]", "status.addresses[].type", "status.addresses[].address"), nil},
		{"NetworkPolicy", &networkingv1.NetworkPolicy{}, append(slices.Clone(meta), "spec.*"), nil},
		{"ClusterNetworkPolicy", &npav1beta1.ClusterNetworkPolicy{}, append(slices.Clone(meta), "metadata.generation", "spec.*", "status.*"), nil},
	}
	filler := randfill.NewWithSeed(1).NilChance(0).NumElements(1, 2).Funcs(
		func(q *resource.Quantity, c randfill.Continue) { *q = resource.MustParse("1") },
		func(v *intstr.IntOrString, c randfill.Continue) { *v = intstr.FromInt32(80) },
		func(v *metav1.FieldsV1, c randfill.Continue) { v.Raw = []byte(`{"f:metadata":{}}`) },
		func(v *runtime.RawExtension, c randfill.Continue) { v.Raw = []byte(`{}`) },
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			filler.Fill(tt.obj)
			if tt.prepare != nil {
				tt.prepare(tt.obj)
			}
			before := leaves(t, tt.obj)
			got, err := Transform(tt.obj)
			if err != nil {
				t.Fatal(err)
			}
			if inv, ok := got.(*invalidObject); ok {
				got = inv.Object
			}
			if p, ok := got.(*cluster.Pod); ok {
				got = p.APIObject()
			}
			after := leaves(t, got)
			for _, f := range after {
				if !allowed(f, tt.allowed) {
					t.Errorf("field %s survived", f)
				}
			}
			// Every allowed field that was set is kept.
			for _, f := range before {
				if allowed(f, tt.allowed) && !slices.Contains(after, f) {
					t.Errorf("field %s was dropped", f)
				}
			}
			if len(before) <= len(after) {
				t.Errorf("nothing dropped: %d fields before, %d after", len(before), len(after))
			}
		})
	}
}

func allowed(field string, allowed []string) bool {
	for _, a := range allowed {
		if field == a || strings.HasPrefix(field, a+".") || (strings.HasSuffix(a, ".*") && strings.HasPrefix(field, strings.TrimSuffix(a, "*"))) {
			return true
		}
	}
	return false
}

// leaves returns the paths of the non-empty leaves of obj's JSON, with "[]" for any list index;
// maps of strings (labels...) count as one leaf.
func leaves(t *testing.T, obj any) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(toJSON(t, obj)), &v); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if path == "metadata.labels" || path == "metadata.annotations" {
				if len(x) > 0 {
					set[path] = true
				}
				return
			}
			for k, e := range x {
				p := k
				if path != "" {
					p = path + "." + k
				}
				walk(p, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		case nil:
		default:
			if x != "" && x != false && x != float64(0) {
				set[path] = true
			}
		}
	}
	walk("", v)
	delete(set, "kind")
	delete(set, "apiVersion")
	return slices.Sorted(maps.Keys(set))
}

func toJSON(t *testing.T, obj any) string {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
