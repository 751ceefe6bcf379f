package cluster

import (
	"encoding/binary"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// Interner makes objects stripped through it share their equal parts: label sets (metadata.labels,
// matchLabels) and Pods' container port lists. Thousands of objects of a cluster carry the same
// few label sets (every replica of a workload the same labels, policies the same selectors), and
// a small map costs some 300 bytes; sharing them is most of what a source holds. What is shared
// is read-only like every part of a stored object.
//
// The tables are bounded: one that reaches internLimit entries is dropped and started again, so
// that label sets that come and go (pod-template-hash at every rollout) cannot grow it without
// end. The objects keep what they share. Safe for concurrent use; the nil *Interner shares
// nothing.
type Interner struct {
	mu         sync.Mutex
	labels     map[string]map[string]string
	containers map[string][]corev1.Container
	key        []byte // scratch for the table keys, under mu
}

// internLimit bounds the entries of each table of an Interner: far more distinct label sets than
// a cluster's workloads and policies use, and still few enough (about 1.5 MB of small sets) that
// what the tables keep of sets no object uses any more does not matter.
const internLimit = 4096

// NewInterner returns an empty Interner.
func NewInterner() *Interner {
	return &Interner{labels: map[string]map[string]string{}, containers: map[string][]corev1.Container{}}
}

// Labels returns a map equal to m (nil for nil, empty for empty), the same for every equal m
// since the table was last started again. m must not be written afterwards, nor the result.
func (in *Interner) Labels(m map[string]string) map[string]string {
	if in == nil || m == nil {
		return m
	}
	var small [8]string
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	in.mu.Lock()
	defer in.mu.Unlock()
	b := in.key[:0]
	for _, k := range keys {
		b = appendString(b, k)
		b = appendString(b, m[k])
	}
	in.key = b
	if c, ok := in.labels[string(b)]; ok {
		return c
	}
	if len(in.labels) >= internLimit {
		in.labels = map[string]map[string]string{}
	}
	in.labels[string(b)] = m
	return m
}

// containerPorts keeps, for each container that has ports, only the ports' name, number and
// protocol. It returns nil when no container has ports, and through in the same slice for
// containers with the same ports.
func (in *Interner) containerPorts(containers []corev1.Container) []corev1.Container {
	n := 0
	for i := range containers {
		if len(containers[i].Ports) > 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if in == nil {
		return buildContainerPorts(containers, n)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	// What the result is made of, and nothing else: a count of ports for each container that
	// has some, then each port.
	b := in.key[:0]
	for i := range containers {
		if len(containers[i].Ports) == 0 {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(containers[i].Ports)))
		for _, p := range containers[i].Ports {
			b = appendString(b, p.Name)
			b = binary.AppendUvarint(b, uint64(uint32(p.ContainerPort)))
			b = appendString(b, string(p.Protocol))
		}
	}
	in.key = b
	if c, ok := in.containers[string(b)]; ok {
		return c
	}
	if len(in.containers) >= internLimit {
		in.containers = map[string][]corev1.Container{}
	}
	c := buildContainerPorts(containers, n)
	in.containers[string(b)] = c
	return c
}

// buildContainerPorts is containerPorts without sharing; n is the number of containers with ports.
func buildContainerPorts(containers []corev1.Container, n int) []corev1.Container {
	out := make([]corev1.Container, 0, n)
	for i := range containers {
		if len(containers[i].Ports) == 0 {
			continue
		}
		ports := make([]corev1.ContainerPort, len(containers[i].Ports))
		for j, p := range containers[i].Ports {
			ports[j] = corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol}
		}
		out = append(out, corev1.Container{Ports: ports})
	}
	return out
}

// appendString appends s with its length, so that a sequence of them reads back one way only.
func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}
