package policy

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// WithStandIns returns st where each pod of keys (every pod when keys is empty) that
// NetworkPolicy will judge once it has an address, but has none yet (pending, or not applied),
// holds a stand-in address of each family the cluster's pods use (IPv4 alone when none has an
// address), from the documentation ranges and unused by any pod, node or address among keys,
// and node when it has none. It returns which keys got one, and their addresses. A pod is judged by its namespace, labels and
// ports, never by its address, except where a rule names addresses (ipBlock, networks): those
// verdicts are marked as depending on the address it will get.
func WithStandIns(st *cluster.State, node string, keys ...string) (*cluster.State, map[string][]netip.Addr) {
	if len(keys) == 0 {
		keys = slices.Sorted(st.Pods.Keys())
	}
	var pending []string
	for _, k := range keys {
		p := st.Pods.Get(k)
		if p != nil && !p.HostNetwork && p.Phase != corev1.PodSucceeded && p.Phase != corev1.PodFailed &&
			len(EligibleIPs(p)) == 0 && !slices.Contains(pending, k) {
			pending = append(pending, k)
		}
	}
	if len(pending) == 0 {
		return st, nil
	}
	used, v4, v6 := map[netip.Addr]bool{}, false, false
	for _, p := range st.Pods.All() {
		for _, a := range EligibleIPs(p) {
			used[a], v4, v6 = true, v4 || a.Is4(), v6 || a.Is6()
		}
	}
	v4 = v4 || !v6
	for _, n := range st.Nodes {
		for _, na := range n.Status.Addresses {
			if a, err := netip.ParseAddr(na.Address); err == nil {
				used[a.Unmap()] = true
			}
		}
	}
	for _, k := range keys {
		if a, err := netip.ParseAddr(k); err == nil {
			used[a.Unmap()] = true
		}
	}
	next := func(a netip.Addr) netip.Addr {
		for a = a.Next(); used[a]; a = a.Next() {
		}
		used[a] = true
		return a
	}
	a4, a6 := netip.MustParseAddr("192.0.2.0"), netip.MustParseAddr("2001:db8::")
	out := *st
	out.Pods = st.Pods.Clone()
	out.Changes = nil
	given := map[string][]netip.Addr{}
	for _, k := range pending {
		p := *st.Pods.Get(k)
		var ips []netip.Addr
		if v4 {
			a4 = next(a4)
			ips = append(ips, a4)
		}
		if v6 {
			a6 = next(a6)
			ips = append(ips, a6)
		}
		p.IPs = ips
		if p.NodeName == "" {
			p.NodeName = node
		}
		out.Pods.Set(k, &p)
		given[k] = ips
	}
	return &out, given
}
