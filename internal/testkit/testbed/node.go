package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LocalNodeName is the Name of the bed's own node (LocalNode).
const LocalNodeName = "local"

// maxExtraNodes bounds AddNode: node k (0 = local) has underlay host number
// k+1, which must fit 10.255.0.0/24 without the broadcast address.
const maxExtraNodes = 253

// Default pod CIDRs of extra nodes: the k-th extra node gets
// 10.244.k.0/24 and fd00:10:244:k::/64, unless that overlaps the local
// node's or another node's CIDRs, in which case the next free index is used.
var (
	defaultNodeCIDRv4Base = netip.MustParseAddr("10.244.0.0")
	defaultNodeCIDRv6Base = netip.MustParseAddr("fd00:10:244::")
)

// Node is a simulated Kubernetes node: a network namespace with pods wired
// to it like the bed's (per Config.Topology), a gateway address per family
// facing its pods, and its own echo servers on those addresses. The bed's
// own node is LocalNode; extra nodes come from AddNode and are joined to
// all other nodes through the underlay (see AddNode).
//
// Node methods are safe for concurrent use.
type Node struct {
	// Name identifies the node within its bed (LocalNodeName for the
	// local node).
	Name string
	// NetNSName is the node's network namespace name (for `ip netns exec`).
	NetNSName string
	// PodCIDRv4 and PodCIDRv6 are the node's pod CIDRs; the zero Prefix for
	// a disabled address family.
	PodCIDRv4, PodCIDRv6 netip.Prefix

	bed   *Bed
	index int // 0: local node; k: the k-th extra node
	ns    netns.NsHandle
	h     *netlink.Handle
	ips   []netip.Addr // gateway addresses facing the pods
	srv   *servers

	// guarded by bed.mu
	pods    []*Pod
	removed bool
	ulIPs   []netip.Addr // set once attachment to the underlay started
	ulSrv   *servers     // servers on ulIPs (guarded by opMu)
}

// NodeConfig describes an extra node for AddNodeWithConfig. Zero-valued
// CIDRs get defaults (see AddNode).
type NodeConfig struct {
	Name                 string
	PodCIDRv4, PodCIDRv6 netip.Prefix
}

func (b *Bed) newNode(index int, name, nsName string, cidr4, cidr6 netip.Prefix) *Node {
	n := &Node{Name: name, NetNSName: nsName, bed: b, index: index, ns: netns.None()}
	if b.cfg.IPv4 {
		n.PodCIDRv4 = cidr4
	}
	if b.cfg.IPv6 {
		n.PodCIDRv6 = cidr6
	}
	return n
}

// setup creates the node netns (lo up, IPv4/IPv6 forwarding on, no DAD),
// the gateway interface holding the node IPs (lo for Routed, a bridge for
// Bridge), and starts the node's servers. extraCtls are set right after the
// netns is created. On error, teardownNode cleans up.
func (n *Node) setup(extraCtls []sysctl) error {
	b := n.bed
	var err error
	n.ns, err = createNamedNetNS(n.NetNSName)
	if err != nil {
		return err
	}
	b.nsNames[n.NetNSName] = true

	ctls := []sysctl{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.all.forwarding", "1"},
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_ra", "0"},
		{"net.ipv6.conf.default.router_solicitations", "0"},
	}
	if b.cfg.Topology == Bridge {
		ctls = append(ctls,
			sysctl{"net.bridge.bridge-nf-call-iptables", "1"},
			sysctl{"net.bridge.bridge-nf-call-ip6tables", "1"},
		)
	}
	ctls = append(ctls, extraCtls...)
	if err := setSysctls(n.ns, ctls); err != nil {
		return err
	}
	n.h, err = netlink.NewHandleAt(n.ns)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	if err := linkUp(n.h, "lo"); err != nil {
		return err
	}

	if n.PodCIDRv4.IsValid() {
		n.ips = append(n.ips, n.PodCIDRv4.Addr().Next())
	}
	if n.PodCIDRv6.IsValid() {
		n.ips = append(n.ips, n.PodCIDRv6.Addr().Next())
	}
	b.mu.Lock()
	for _, ip := range n.ips {
		b.usedIP[ip] = true
	}
	b.mu.Unlock()

	gwName := gwIfName
	if b.cfg.Topology == Bridge {
		gwName = bridgeIfName
		snoop := false
		br := &netlink.Bridge{
			LinkAttrs: netlink.LinkAttrs{
				Name: bridgeIfName,
				// A fixed MAC: otherwise the bridge adopts the lowest port
				// MAC, which changes as pods come and go and would leave
				// stale gateway ARP/ND entries in the pods.
				HardwareAddr: b.macFor(0x58, n.ips[0]),
			},
			// Without an MLD querier, snooping can make ND unreliable.
			MulticastSnooping: &snoop,
		}
		if err := n.h.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge %s: %w", bridgeIfName, err)
		}
	}
	gwLink, err := n.h.LinkByName(gwName)
	if err != nil {
		return err
	}
	for _, ip := range n.ips {
		bits := ip.BitLen() // routed: host route only
		if b.cfg.Topology == Bridge {
			bits = n.cidr(ip).Bits()
		}
		if err := addAddr(n.h, gwLink, netip.PrefixFrom(ip, bits)); err != nil {
			return err
		}
	}
	if err := n.h.LinkSetUp(gwLink); err != nil {
		return fmt.Errorf("set %s up: %w", gwLink.Attrs().Name, err)
	}

	n.srv, err = b.startServers(n.ns, n.ips)
	return err
}

// cidr returns n's pod CIDR of ip's family.
func (n *Node) cidr(ip netip.Addr) netip.Prefix {
	if ip.Is4() {
		return n.PodCIDRv4
	}
	return n.PodCIDRv6
}

// teardownNode releases everything setup, AddPod and attachUnderlay created
// for n: its pods, servers, underlay attachment, netlink handle and netns.
// closing skips the per-route cleanup on the other nodes (they are going
// away too). Caller holds opMu; n must no longer be in b.nodes.
func (b *Bed) teardownNode(n *Node, closing bool) error {
	b.mu.Lock()
	n.removed = true
	pods := n.pods
	n.pods = nil
	b.mu.Unlock()

	var errs []error
	for _, p := range pods {
		errs = append(errs, b.teardownPod(p))
	}
	if n.srv != nil {
		n.srv.close()
		n.srv = nil
	}
	if !closing {
		errs = append(errs, b.detachUnderlay(n))
	} else if n.ulSrv != nil {
		n.ulSrv.close()
		n.ulSrv = nil
	}
	if n.h != nil {
		n.h.Close()
		n.h = nil
	}
	b.mu.Lock()
	if n.ns.IsOpen() {
		n.ns.Close()
	}
	for _, ip := range n.ips {
		delete(b.usedIP, ip)
	}
	b.mu.Unlock()
	if b.nsNames[n.NetNSName] {
		if err := deleteNamedNetNS(n.NetNSName); err != nil {
			errs = append(errs, err)
		} else {
			delete(b.nsNames, n.NetNSName)
		}
	}
	return errors.Join(errs...)
}

// AddNode adds an extra node named name with default pod CIDRs (the k-th
// extra node gets 10.244.k.0/24 and fd00:10:244:k::/64, or the next index
// whose CIDRs overlap neither the local node's nor another node's).
//
// The node gets the bed's Topology and address families. All nodes are
// joined through the underlay: a netns (UnderlayNetNSName) holding a bridge
// that every node, the local one included, attaches to with a veth named
// UplinkIfName, addressed 10.255.0.<k+1>/24 and fd00:255::<k+1>/64 (k = 0
// for the local node). Every node routes every other node's pod CIDRs via
// that node's underlay address (static neighbours, no ARP/ND, no NAT), so
// pod-to-pod traffic between nodes crosses the source node's forward hook,
// the underlay, and the destination node's forward hook. The underlay and
// the local node's uplink are created by the first AddNode; nothing changes
// in the local node before that.
func (b *Bed) AddNode(name string) (*Node, error) {
	return b.AddNodeWithConfig(NodeConfig{Name: name})
}

// AddNodeWithConfig is AddNode with explicit pod CIDRs. CIDRs of a disabled
// address family are ignored; the others must not overlap the pod CIDRs of
// any node nor the underlay's.
func (b *Bed) AddNodeWithConfig(cfg NodeConfig) (*Node, error) {
	b.opMu.Lock()
	defer b.opMu.Unlock()

	b.mu.Lock()
	n, err := b.newExtraNodeLocked(cfg)
	b.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("testbed: adding node %q: %w", cfg.Name, err)
	}

	err = n.setup([]sysctl{
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
	})
	if err == nil {
		err = b.ensureUnderlay()
	}
	if err == nil {
		err = b.attachUnderlay(n)
	}
	if err == nil && b.testHookAttached != nil {
		err = b.testHookAttached(n)
	}
	if err != nil {
		terr := b.teardownNode(n, false)
		if terr == nil {
			b.mu.Lock()
			b.nodeSeq = n.index - 1 // nothing of n is left: its index is free again
			b.mu.Unlock()
		}
		return nil, errors.Join(fmt.Errorf("testbed: adding node %q (%s): %w", n.Name, n.NetNSName, err), terr)
	}
	b.mu.Lock()
	b.nodes = append(b.nodes, n)
	b.mu.Unlock()
	return n, nil
}

// newExtraNodeLocked validates cfg and returns the new node, not yet set up.
// Caller holds opMu and mu.
func (b *Bed) newExtraNodeLocked(cfg NodeConfig) (*Node, error) {
	if b.closed {
		return nil, errors.New("bed is closed")
	}
	if cfg.Name == "" {
		return nil, errors.New("empty node name")
	}
	if cfg.Name == b.local.Name || slices.ContainsFunc(b.nodes, func(n *Node) bool { return n.Name == cfg.Name }) {
		return nil, errors.New("a node with that name already exists")
	}
	if b.nodeSeq >= maxExtraNodes {
		return nil, fmt.Errorf("at most %d extra nodes per bed", maxExtraNodes)
	}
	k := b.nodeSeq + 1

	// Prefixes that the new pod CIDRs must not overlap.
	var taken []netip.Prefix
	for _, n := range append([]*Node{b.local}, b.nodes...) {
		taken = append(taken, n.PodCIDRv4, n.PodCIDRv6)
	}
	// The local node's CIDRs are reserved even for a disabled family.
	taken = append(taken, b.cfg.PodCIDRv4, b.cfg.PodCIDRv6, underlayCIDRv4, underlayCIDRv6)
	free := func(p netip.Prefix) bool {
		return !slices.ContainsFunc(taken, func(t netip.Prefix) bool { return t.IsValid() && t.Overlaps(p) })
	}

	cidr4, cidr6 := cfg.PodCIDRv4.Masked(), cfg.PodCIDRv6.Masked()
	if !b.cfg.IPv4 {
		cidr4 = netip.Prefix{}
	}
	if !b.cfg.IPv6 {
		cidr6 = netip.Prefix{}
	}
	if b.cfg.IPv4 && cidr4.IsValid() {
		if !cidr4.Addr().Is4() || cidr4.Bits() > 30 {
			return nil, fmt.Errorf("PodCIDRv4 %s must be an IPv4 prefix of at most /30", cidr4)
		}
		if !free(cidr4) {
			return nil, fmt.Errorf("PodCIDRv4 %s overlaps another node's pod CIDR or the underlay", cidr4)
		}
	}
	if b.cfg.IPv6 && cidr6.IsValid() {
		if !cidr6.Addr().Is6() || cidr6.Addr().Is4In6() || cidr6.Bits() > 126 {
			return nil, fmt.Errorf("PodCIDRv6 %s must be an IPv6 prefix of at most /126", cidr6)
		}
		if !free(cidr6) {
			return nil, fmt.Errorf("PodCIDRv6 %s overlaps another node's pod CIDR or the underlay", cidr6)
		}
	}
	need4 := b.cfg.IPv4 && !cidr4.IsValid()
	need6 := b.cfg.IPv6 && !cidr6.IsValid()
	if need4 || need6 {
		found := false
		for i := k; i <= 255 && !found; i++ {
			c4, c6 := defaultNodeCIDRs(i)
			if (!need4 || free(c4)) && (!need6 || free(c6)) {
				if need4 {
					cidr4 = c4
				}
				if need6 {
					cidr6 = c6
				}
				found = true
			}
		}
		if !found {
			return nil, errors.New("no free default pod CIDR (10.244.<i>.0/24, fd00:10:244:<i>::/64); use AddNodeWithConfig")
		}
	}
	b.nodeSeq = k
	nsName := fmt.Sprintf("%s-n%d-%s", b.id, k, sanitize(cfg.Name))
	return b.newNode(k, cfg.Name, nsName, cidr4, cidr6), nil
}

// defaultNodeCIDRs returns 10.244.i.0/24 and fd00:10:244:i::/64.
func defaultNodeCIDRs(i int) (netip.Prefix, netip.Prefix) {
	a4 := defaultNodeCIDRv4Base.As4()
	a4[2] = byte(i)
	a6 := defaultNodeCIDRv6Base.As16()
	a6[6], a6[7] = byte(i>>8), byte(i)
	return netip.PrefixFrom(netip.AddrFrom4(a4), 24), netip.PrefixFrom(netip.AddrFrom16(a6), 64)
}

// RemoveNode deletes an extra node: its pods, servers, routes to it on the
// other nodes, its uplink and its netns. Its pod CIDRs become free again
// (its index is not reused).
func (b *Bed) RemoveNode(n *Node) error {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	b.mu.Lock()
	i := slices.Index(b.nodes, n)
	if i < 0 {
		b.mu.Unlock()
		return fmt.Errorf("testbed: node %q is not an extra node of this bed", n.Name)
	}
	b.nodes = append(b.nodes[:i:i], b.nodes[i+1:]...)
	b.mu.Unlock()
	return b.teardownNode(n, false)
}

// Nodes returns the extra nodes (not the local one) in creation order.
func (b *Bed) Nodes() []*Node {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Clone(b.nodes)
}

// Node returns the node with the given name (LocalNodeName for the local
// node), or nil.
func (b *Bed) Node(name string) *Node {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, n := range append([]*Node{b.local}, b.nodes...) {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// LocalNode returns the bed's own node as a Node: LocalNode().AddPod is
// AddPod, and so on.
func (b *Bed) LocalNode() *Node { return b.local }

// AllPods returns the pods of every node: the local node's first, then each
// extra node's, each in creation order.
func (b *Bed) AllPods() []*Pod {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := slices.Clone(b.local.pods)
	for _, n := range b.nodes {
		out = append(out, n.pods...)
	}
	return out
}

// Node returns the node the pod runs on.
func (p *Pod) Node() *Node { return p.node }

// IsLocal reports whether n is the bed's own (local) node.
func (n *Node) IsLocal() bool { return n.index == 0 }

// String returns the node's name.
func (n *Node) String() string { return n.Name }

// NetNSPath returns "/var/run/netns/<NetNSName>".
func (n *Node) NetNSPath() string { return filepath.Join(NetNSDir, n.NetNSName) }

// NodeIPs returns the node's addresses facing its pods (the first address of
// each enabled pod CIDR, IPv4 first). They are its pods' default gateways.
func (n *Node) NodeIPs() []netip.Addr { return slices.Clone(n.ips) }

// NodeIP returns the node IP of the given family (4 or 6), or the zero Addr.
func (n *Node) NodeIP(family int) netip.Addr { return pickFamily(n.ips, family) }

// UnderlayIPs returns the node's addresses on the underlay (IPv4 first), or
// nil while it is not attached (the local node before the first AddNode).
func (n *Node) UnderlayIPs() []netip.Addr {
	n.bed.mu.RLock()
	defer n.bed.mu.RUnlock()
	return slices.Clone(n.ulIPs)
}

// UnderlayIP returns the underlay address of the given family, or the zero
// Addr.
func (n *Node) UnderlayIP(family int) netip.Addr { return pickFamily(n.UnderlayIPs(), family) }

func pickFamily(ips []netip.Addr, fam int) netip.Addr {
	for _, ip := range ips {
		if (fam == 4) == ip.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}

// Pods returns the node's current pods in creation order.
func (n *Node) Pods() []*Pod {
	n.bed.mu.RLock()
	defer n.bed.mu.RUnlock()
	return slices.Clone(n.pods)
}

// Pod returns the node's pod with the given namespace and name, or nil.
func (n *Node) Pod(namespace, name string) *Pod {
	n.bed.mu.RLock()
	defer n.bed.mu.RUnlock()
	for _, p := range n.pods {
		if p.Namespace == namespace && p.Name == name {
			return p
		}
	}
	return nil
}

// InNetNS runs fn on the calling goroutine with its OS thread locked and
// switched into the node's netns (see Bed.InNode).
func (n *Node) InNetNS(fn func() error) error {
	ns, err := n.bed.nodeNS(n)
	if err != nil {
		return err
	}
	defer ns.Close()
	return inNetNS(ns, fn)
}

// Exec runs a command inside the node's netns (like `ip netns exec`, but
// without remounting /sys) and returns its combined output.
func (n *Node) Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out []byte
	err := n.InNetNSGo(func() error {
		var err error
		out, err = exec.CommandContext(ctx, name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return out, fmt.Errorf("%s %v in %s: %w: %s", name, args, n.NetNSName, err, out)
	}
	return out, nil
}

// InNetNSGo is InNetNS on a fresh goroutine (which it waits for).
func (n *Node) InNetNSGo(fn func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- n.InNetNS(fn) }()
	return <-ch
}

// nodeNS returns a private duplicate of n's netns handle.
func (b *Bed) nodeNS(n *Node) (netns.NsHandle, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !n.ns.IsOpen() {
		return netns.None(), fmt.Errorf("testbed: node %s netns is gone", n.Name)
	}
	return dupNS(n.ns)
}

// dupNS returns a private duplicate of h, to be closed by the caller.
func dupNS(h netns.NsHandle) (netns.NsHandle, error) {
	fd, err := unix.FcntlInt(uintptr(h), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("dup netns handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// Probe is Bed.Probe with a nil Src meaning node n.
func (n *Node) Probe(ctx context.Context, p Probe) bool {
	ok, _ := n.ProbeResult(ctx, p)
	return ok
}

// ProbeResult is Bed.ProbeResult with a nil Src meaning node n.
func (n *Node) ProbeResult(ctx context.Context, p Probe) (bool, error) {
	return n.bed.probe(ctx, n, p)
}

// ProbeAll is Bed.ProbeAll with a nil Src meaning node n.
func (n *Node) ProbeAll(ctx context.Context, probes []Probe) []bool {
	errs := n.ProbeAllResults(ctx, probes)
	res := make([]bool, len(probes))
	for i, err := range errs {
		res[i] = err == nil
	}
	return res
}

// ProbeAllResults is Bed.ProbeAllResults with a nil Src meaning node n.
func (n *Node) ProbeAllResults(ctx context.Context, probes []Probe) []error {
	return n.bed.probeAll(ctx, n, probes)
}
