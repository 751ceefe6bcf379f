// Package domains learns the addresses of the domainNames peers of ClusterNetworkPolicies from
// the cluster DNS's answers to the node's pods, and has the NetworkPolicy backend hold each in
// the kernel for its TTL and a grace.
//
// The answers are held, not copied: a rule of the package's own (table ip/ip6 netwarden-dns)
// queues every DNS reply from a cluster DNS server to userspace (NFQUEUE, with bypass), the
// learner reads the answer, writes its addresses into the kernel's sets in one transaction,
// and only then lets the reply go on to the pod. So the pod cannot connect before the kernel
// admits the address: no first-packet drops, no race. Replies are believed only from the
// configured servers and only as replies of a connection the pod opened (conntrack's reply
// direction), over UDP and TCP; a forged answer from any other address is never queued.
//
// While the agent is down or restarting, the kernel lets queued replies pass unread (the
// queue's bypass and fail-open flags): the pods' DNS keeps working, and the addresses of the
// answers it misses are simply not admitted by the Accept-only rules until they are asked
// again. Addresses already learned stay in the kernel until their timeouts end.
package domains

import "strings"

// Matches reports whether name (lower case, no trailing dot) is one that pattern admits: the
// name itself, or, for "*.suffix", a name of one or more labels before suffix.
func Matches(pattern, name string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return len(name) > len(suffix)+1 && strings.HasSuffix(name, suffix) && name[len(name)-len(suffix)-1] == '.'
	}
	return name == pattern
}

// canonical is a DNS name as patterns are written: lower case, without the trailing dot.
func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}
