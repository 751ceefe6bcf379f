// Package services tests NetworkPolicy on the paths Services take, with a real kube-proxy
// (internal/testkit/kubeproxy) and the netwarden agent driven by a real kube-apiserver
// (internal/testkit/kubetest), on a two-node testbed whose nodes, pods and servers are network
// namespaces. Every netwarden backend (nftables, iptables-nft, iptables-legacy) runs with every
// kube-proxy mode (nftables, iptables of the same iptables variant).
//
// Each node runs kube-proxy and the agent. The test writes what a control plane would: Node
// objects with podCIDRs and InternalIPs (the underlay addresses), running Pods with their IPs,
// Services, and EndpointSlices (no controller manager runs). The servers behind the Services
// answer with their own name, so every probe knows which endpoint it reached, and each
// connection is checked against the verdict of the NetworkPolicy of the endpoint it reached:
//
//   - pod -> ClusterIP, endpoint on the same node and on the other node, IPv4 and IPv6;
//   - several endpoints behind one ClusterIP, each judged by its own policy;
//   - NodePort from outside the node (the other node's netns and pods), externalTrafficPolicy
//     Cluster and Local; with Local, and with Cluster to an endpoint on the receiving node, the
//     client's address reaches the policy (an ipBlock decides); with Cluster to an endpoint on
//     the other node, the receiving node's address does;
//   - hairpin: a pod reaching itself through its own Service (ClusterIP and NodePort), judged as
//     traffic from itself;
//   - node -> Service -> pod, from the node netns;
//   - a ClusterIP whose endpoint is the node's own address (a hostNetwork server in the node
//     netns), reached from a pod on that node: the connection works, its reply is not judged as
//     new ingress to the isolated client (kubernetes-sigs/kube-network-policies issue 379);
//   - kube-proxy started before the agent, started after it (its rules removed with --cleanup
//     first, so it hooks in afresh), and restarted while probes run: every verdict holds at
//     every probe.
//
// Syncs are waited for, never slept on: the agent's /status covers the resourceVersions the
// API server returned, and kube-proxy's rules in the kernel match the Services and
// EndpointSlices (kubeproxy.WaitProgrammed). The tests need root; they change nothing outside
// the namespaces they create.
package services
