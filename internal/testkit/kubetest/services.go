package kubetest

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DualStackServiceRange is a --service-cluster-ip-range for ExtraAPIServerArgs that gives
// Services an IPv6 cluster IP too (ServiceClusterIPRange and a ULA /112).
const DualStackServiceRange = ServiceClusterIPRange + ",fd00:96::/112"

// CreateNode creates a Node with the given pod CIDRs (spec.podCIDR and spec.podCIDRs) and
// InternalIP addresses (status.addresses, written through the status subresource, as a kubelet
// would), and returns it as the API server returned the status write.
func CreateNode(ctx context.Context, c kubernetes.Interface, name string, podCIDRs []netip.Prefix, internalIPs []netip.Addr) (*corev1.Node, error) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	for _, p := range podCIDRs {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.Masked().String())
	}
	if len(n.Spec.PodCIDRs) > 0 {
		n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
	}
	created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating node %s: %w", name, err)
	}
	for _, ip := range internalIPs {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	out, err := c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("writing the status of node %s: %w", name, err)
	}
	return out, nil
}

// SliceEndpoint is one endpoint of an EndpointSlice written by EndpointSlices.
type SliceEndpoint struct {
	IP       netip.Addr
	NodeName string // the node the endpoint runs on (kube-proxy's externalTrafficPolicy Local)
	// PodName names the pod in targetRef; empty for an endpoint that is no pod (a node address).
	PodName string
	// NotReady marks the endpoint not ready.
	NotReady bool
}

// EndpointSlices builds the EndpointSlices an endpointslice controller would write for svc:
// one per IP family among eps, named <service>-ipv4 / -ipv6, labelled
// kubernetes.io/service-name and managed-by a controller of the test, with svc's ports (their
// target ports, which must be numbers).
func EndpointSlices(svc *corev1.Service, eps ...SliceEndpoint) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: svc.Namespace,
				Name:      fmt.Sprintf("%s-%s", svc.Name, map[discoveryv1.AddressType]string{discoveryv1.AddressTypeIPv4: "ipv4", discoveryv1.AddressTypeIPv6: "ipv6"}[fam]),
				Labels: map[string]string{
					discoveryv1.LabelServiceName: svc.Name,
					discoveryv1.LabelManagedBy:   "kubetest.netwarden.test",
				},
			},
			AddressType: fam,
		}
		for _, sp := range svc.Spec.Ports {
			name, proto, port := sp.Name, sp.Protocol, sp.TargetPort.IntVal
			if port == 0 {
				port = sp.Port
			}
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for _, ep := range eps {
			if (fam == discoveryv1.AddressTypeIPv4) != ep.IP.Is4() {
				continue
			}
			ready := !ep.NotReady
			e := discoveryv1.Endpoint{
				Addresses:  []string{ep.IP.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
			}
			if ep.NodeName != "" {
				node := ep.NodeName
				e.NodeName = &node
			}
			if ep.PodName != "" {
				e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: ep.PodName}
			}
			es.Endpoints = append(es.Endpoints, e)
		}
		if len(es.Endpoints) > 0 {
			out = append(out, es)
		}
	}
	return out
}

// ApplyEndpointSlices creates each slice, or replaces the one of the same name.
func ApplyEndpointSlices(ctx context.Context, c kubernetes.Interface, slices ...*discoveryv1.EndpointSlice) error {
	for _, es := range slices {
		api := c.DiscoveryV1().EndpointSlices(es.Namespace)
		_, err := api.Create(ctx, es, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *discoveryv1.EndpointSlice
			cur, err = api.Get(ctx, es.Name, metav1.GetOptions{})
			if err == nil {
				es = es.DeepCopy()
				es.ResourceVersion = cur.ResourceVersion
				_, err = api.Update(ctx, es, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("writing EndpointSlice %s/%s: %w", es.Namespace, es.Name, err)
		}
	}
	return nil
}
