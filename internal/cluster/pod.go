package cluster

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is what the agent keeps of a pod: every pod of the cluster may be a policy's peer, so
// every node holds them all, and at 150,000 pods a corev1.Pod (1,240 bytes before its strings,
// however stripped) is most of the agent's memory. A Pod is about 150 bytes and shares its
// labels, ports, namespace and node names with the pods that have equal ones (see Interner).
//
// A Pod is made of a defaulted and validated corev1.Pod (Interner.Pod) and never modified
// afterwards; snapshots and client-go's informer stores share it (it implements metav1.Object
// for their key functions).
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	ResourceVersion string
	NodeName        string // spec.nodeName
	Phase           corev1.PodPhase
	HostNetwork     bool
	// IPs are status.podIPs (status.podIP when that is empty), in their order, IPv4-mapped
	// IPv6 addresses unmapped.
	IPs []netip.Addr
	// Ports are the ports of spec.containers, which named ports in policies resolve to (those
	// of init containers are validated, not kept). Protocol is defaulted.
	Ports []ContainerPort
}

// ContainerPort is what the agent keeps of a container port.
type ContainerPort struct {
	Name     string
	Port     int32
	Protocol corev1.Protocol
}

// Key returns the pod's key in State.Pods.
func (p *Pod) Key() string { return Key(p.Namespace, p.Name) }

// EqualIgnoringResourceVersion reports whether p and q keep the same things, their
// resourceVersions aside: an update of fields the agent does not keep.
func (p *Pod) EqualIgnoringResourceVersion(q *Pod) bool {
	if p == q {
		return true
	}
	if p == nil || q == nil {
		return false
	}
	return p.Namespace == q.Namespace && p.Name == q.Name && p.NodeName == q.NodeName && p.Phase == q.Phase &&
		p.HostNetwork == q.HostNetwork && maps.Equal(p.Labels, q.Labels) && slices.Equal(p.IPs, q.IPs) && slices.Equal(p.Ports, q.Ports)
}

// PodOf returns what the agent keeps of pod, defaulted (as the sources make it, without their
// validation or sharing); pod is not modified. For tests and tools that build states by hand.
func PodOf(pod *corev1.Pod) *Pod {
	c := pod.DeepCopy()
	DefaultPod(c)
	return (*Interner)(nil).Pod(c)
}

// APIObject returns a corev1.Pod holding what p keeps, as a source would have read it (the
// reverse of PodOf): for tests and tools that write pods out.
func (p *Pod) APIObject() *corev1.Pod {
	out := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: maps.Clone(p.Labels), ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.NodeName, HostNetwork: p.HostNetwork},
		Status:     corev1.PodStatus{Phase: p.Phase},
	}
	if len(p.Ports) > 0 {
		ports := make([]corev1.ContainerPort, len(p.Ports))
		for i, cp := range p.Ports {
			ports[i] = corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.Port, Protocol: cp.Protocol}
		}
		out.Spec.Containers = []corev1.Container{{Name: "main", Ports: ports}}
	}
	for _, a := range p.IPs {
		out.Status.PodIPs = append(out.Status.PodIPs, corev1.PodIP{IP: a.String()})
	}
	if len(out.Status.PodIPs) > 0 {
		out.Status.PodIP = out.Status.PodIPs[0].IP
	}
	return out
}

// Pod returns what the agent keeps of pod, which must be defaulted and valid (DefaultPod,
// ValidatePod); an address that does not parse is left out. Labels, ports and the namespace and
// node names are shared with earlier results equal in them.
func (in *Interner) Pod(pod *corev1.Pod) *Pod {
	out := &Pod{
		Namespace:       in.String(pod.Namespace),
		Name:            pod.Name,
		Labels:          in.Labels(pod.Labels),
		ResourceVersion: pod.ResourceVersion,
		NodeName:        in.String(pod.Spec.NodeName),
		Phase:           pod.Status.Phase,
		HostNetwork:     pod.Spec.HostNetwork,
		Ports:           in.containerPortList(pod.Spec.Containers),
	}
	if n := len(pod.Status.PodIPs); n > 0 {
		out.IPs = make([]netip.Addr, 0, n)
		for _, ip := range pod.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				out.IPs = append(out.IPs, a.Unmap())
			}
		}
	} else if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
		out.IPs = []netip.Addr{a.Unmap()}
	}
	return out
}

// The rest of metav1.Object, for client-go's stores, which key objects by namespace and name:
// a Pod has no other metadata. The setters of what it does not keep do nothing.

func (p *Pod) GetNamespace() string                          { return p.Namespace }
func (p *Pod) SetNamespace(namespace string)                 { p.Namespace = namespace }
func (p *Pod) GetName() string                               { return p.Name }
func (p *Pod) SetName(name string)                           { p.Name = name }
func (p *Pod) GetGenerateName() string                       { return "" }
func (p *Pod) SetGenerateName(string)                        {}
func (p *Pod) GetUID() types.UID                             { return "" }
func (p *Pod) SetUID(types.UID)                              {}
func (p *Pod) GetResourceVersion() string                    { return p.ResourceVersion }
func (p *Pod) SetResourceVersion(version string)             { p.ResourceVersion = version }
func (p *Pod) GetGeneration() int64                          { return 0 }
func (p *Pod) SetGeneration(int64)                           {}
func (p *Pod) GetSelfLink() string                           { return "" }
func (p *Pod) SetSelfLink(string)                            {}
func (p *Pod) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (p *Pod) SetCreationTimestamp(metav1.Time)              {}
func (p *Pod) GetDeletionTimestamp() *metav1.Time            { return nil }
func (p *Pod) SetDeletionTimestamp(*metav1.Time)             {}
func (p *Pod) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (p *Pod) SetDeletionGracePeriodSeconds(*int64)          {}
func (p *Pod) GetLabels() map[string]string                  { return p.Labels }
func (p *Pod) SetLabels(labels map[string]string)            { p.Labels = labels }
func (p *Pod) GetAnnotations() map[string]string             { return nil }
func (p *Pod) SetAnnotations(map[string]string)              {}
func (p *Pod) GetFinalizers() []string                       { return nil }
func (p *Pod) SetFinalizers([]string)                        {}
func (p *Pod) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (p *Pod) SetOwnerReferences([]metav1.OwnerReference)    {}
func (p *Pod) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (p *Pod) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

var _ metav1.Object = (*Pod)(nil)
