package cluster

import (
	"encoding/binary"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// Interner makes objects stripped through it share their equal parts: label sets (metadata.labels,
// matchLabels), and Pods' port lists and namespace and node names. Thousands of objects of a cluster carry the same
// few label sets (every replica of a workload the same labels, policies the same selectors), and
// a small map costs some 300 bytes; sharing them is most of what a source holds. What is shared
// is read-only like every part of a stored object.
//
// The tables are bounded: one that reaches internLimit entries is dropped and started again, so
// that label sets that come and go (pod-template-hash at every rollout) cannot grow it without
// end. The objects keep what they share. Safe for concurrent use; the nil *Interner shares
// nothing.
type Interner struct {
	mu      sync.Mutex
	labels  map[string]map[string]string
	ports   map[string][]ContainerPort
	strings map[string]string
	key     []byte // scratch for the table keys, under mu
}

// internLimit bounds the entries of each table of an Interner: far more distinct label sets than
// a cluster's workloads and policies use, and still few enough (about 1.5 MB of small sets) that
// what the tables keep of sets no object uses any more does not matter.
const internLimit = 4096

// NewInterner returns an empty Interner.
func NewInterner() *Interner {
	return &Interner{labels: map[string]map[string]string{}, ports: map[string][]ContainerPort{}, strings: map[string]string{}}
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

// String returns a string equal to s, the same for every equal s since the table was last
// started again: for the names thousands of pods repeat (namespace, node).
func (in *Interner) String(s string) string {
	if in == nil || s == "" {
		return s
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if c, ok := in.strings[s]; ok {
		return c
	}
	if len(in.strings) >= internLimit {
		in.strings = map[string]string{}
	}
	in.strings[s] = s
	return s
}

// containerPortList returns the ports of containers (nil when they have none), the same slice for equal
// lists since the table was last started again.
func (in *Interner) containerPortList(containers []corev1.Container) []ContainerPort {
	n := 0
	for i := range containers {
		n += len(containers[i].Ports)
	}
	if n == 0 {
		return nil
	}
	build := func() []ContainerPort {
		out := make([]ContainerPort, 0, n)
		for i := range containers {
			for _, p := range containers[i].Ports {
				out = append(out, ContainerPort{Name: p.Name, Port: p.ContainerPort, Protocol: p.Protocol})
			}
		}
		return out
	}
	if in == nil {
		return build()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	b := in.key[:0]
	for i := range containers {
		for _, p := range containers[i].Ports {
			b = appendString(b, p.Name)
			b = binary.AppendUvarint(b, uint64(uint32(p.ContainerPort)))
			b = appendString(b, string(p.Protocol))
		}
	}
	in.key = b
	if c, ok := in.ports[string(b)]; ok {
		return c
	}
	if len(in.ports) >= internLimit {
		in.ports = map[string][]ContainerPort{}
	}
	c := build()
	in.ports[string(b)] = c
	return c
}

// appendString appends s with its length, so that a sequence of them reads back one way only.
func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}
