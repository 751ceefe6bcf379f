// Package testbed simulates a Kubernetes node (and optionally further nodes
// of its cluster) with pods as Linux network namespaces, for testing a
// NetworkPolicy agent that programs nftables inside the node's network
// namespace.
//
// A Bed owns a "node" netns and one netns per pod, connected by veth pairs
// either in a routed (ptp) or a bridged layout. Every pod (and the node) runs
// TCP and UDP echo servers and an SCTP INIT receiver, all as goroutines of the
// test process whose sockets were created inside the respective namespace.
// Probe and ProbeAll then test reachability between them.
//
// Traffic paths, as seen by netfilter in the node netns:
//   - pod -> other pod: forward hook (Routed: IP forwarding; Bridge: bridged,
//     passed to the IP hooks by br_netfilter)
//   - pod -> node IP: input hook; node -> pod: output hook
//
// Multi-node: AddNode adds further full nodes (own netns, pod CIDRs, node
// IPs, servers, same topology) joined with the bed's own ("local") node
// through an underlay netns holding a bridge. Each node has an uplink veth
// (UplinkIfName) on it and routes every other node's pod CIDRs via that
// node's underlay address, without NAT. A pod on one node talking to a pod
// on another crosses the forward hook of both nodes: egress on the source
// node, ingress on the destination node. Probes work from and to pods of
// any node (Node.Probe also from the node netns itself).
//
// Probe semantics: TCP succeeds when the connection is established and a
// 16-byte token is echoed back; UDP when a token is echoed back (resent every
// 100ms); SCTP when the raw-socket receiver in the destination netns sees our
// hand-made INIT (resent every 100ms) for one of the bed's SCTP ports. SCTP
// therefore only tests the INIT direction (no INIT-ACK is ever sent: the
// kernel needs no SCTP support).
//
// Namespaces are named "nwtb-<6 hex>-node", "nwtb-<6 hex>-p<N>-<ns>-<name>",
// and with extra nodes "nwtb-<6 hex>-n<K>-<node>" and "nwtb-<6 hex>-underlay",
// and bind-mounted under /var/run/netns, so `ip netns exec` and
// `nft` work on them. Nothing is ever configured in the caller's (root)
// network namespace. Everything requires root (CAP_SYS_ADMIN + CAP_NET_ADMIN).
package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Topology selects how pods are wired to the node.
type Topology string

const (
	// Routed is ptp style: one veth per pod with the host side in the node
	// netns, /32 and /128 routes per pod, no bridge. The node's gateway
	// addresses live on the node's loopback interface (as /32 and /128; no
	// dummy interface, as not every kernel has the dummy driver).
	Routed Topology = "routed"
	// Bridge enslaves the pods' host-side veths to a Linux bridge in the node
	// netns that holds the gateway addresses. br_netfilter's
	// bridge-nf-call-iptables/-ip6tables are set to 1 in the node netns, so
	// bridged pod-to-pod traffic traverses the IP forward hook.
	Bridge Topology = "bridge"
)

// Config describes a Bed. Zero-valued fields get defaults (a nil port list
// gets DefaultPorts; a non-nil empty list means no servers of that kind).
type Config struct {
	Topology   Topology // default Routed
	IPv4, IPv6 bool     // at least one; dual-stack when both
	PodCIDRv4  netip.Prefix
	PodCIDRv6  netip.Prefix
	TCPPorts   []uint16 // servers started in every pod and the node; default {80, 81}
	UDPPorts   []uint16 // default {80, 81}
	SCTPPorts  []uint16 // default {80, 81}
}

// Default values used by New for unset Config fields.
var (
	DefaultPodCIDRv4 = netip.MustParsePrefix("10.244.0.0/24")
	DefaultPodCIDRv6 = netip.MustParsePrefix("fd00:10:244::/64")
	DefaultPorts     = []uint16{80, 81}
)

const (
	// DefaultTimeout is the default per-probe timeout.
	DefaultTimeout = 700 * time.Millisecond
	// DefaultConcurrency is the default number of parallel probes in ProbeAll.
	DefaultConcurrency = 64

	gwIfName     = "lo"     // routed: holds the node addresses
	bridgeIfName = "tb-br0" // bridge: the bridge holding the node addresses
	podIfName    = "eth0"
)

// Bed is a simulated node with pods. Its methods are safe for concurrent use.
type Bed struct {
	// Timeout bounds every probe (default DefaultTimeout). Set it before
	// probing; it is read without locking.
	Timeout time.Duration
	// Concurrency bounds the number of parallel probes in ProbeAll
	// (default DefaultConcurrency).
	Concurrency int

	cfg   Config
	id    string // "nwtb-<6 hex>"
	local *Node  // the bed's own node (where the agent under test runs)

	opMu    sync.Mutex // serialises AddPod/RemovePod/AddNode/RemoveNode/Close
	mu      sync.RWMutex
	nodes   []*Node // extra nodes, in creation order
	nodeSeq int     // number of extra nodes ever added
	usedIP  map[netip.Addr]bool
	podSeq  int
	closed  bool
	// namespaces created and not yet deleted (for Close after partial failure)
	nsNames map[string]bool
	// ul is the underlay joining the nodes; nil until the first AddNode.
	// Guarded by opMu.
	ul *underlay
	// testHookAttached, if set, runs at the end of AddNode (tests inject
	// failures with it). Guarded by opMu.
	testHookAttached func(*Node) error

	closeOnce sync.Once
	closeErr  error

	sctpMu      sync.Mutex
	sctpWaiters map[uint32]*sctpWaiter
	sctpPorts   map[uint16]bool
}

// Pod is a pod network namespace.
type Pod struct {
	Namespace, Name string
	IPv4, IPv6      netip.Addr // zero value if that family is disabled
	NetNSName       string
	// HostIfName is the name of the host-side veth in its node's netns.
	HostIfName string

	node *Node
	ns   netns.NsHandle
	srv  *servers
}

// IPs returns the pod's addresses, IPv4 first.
func (p *Pod) IPs() []netip.Addr {
	var out []netip.Addr
	if p.IPv4.IsValid() {
		out = append(out, p.IPv4)
	}
	if p.IPv6.IsValid() {
		out = append(out, p.IPv6)
	}
	return out
}

// NetNSPath returns "/var/run/netns/<NetNSName>".
func (p *Pod) NetNSPath() string { return filepath.Join(NetNSDir, p.NetNSName) }

// String returns "namespace/name".
func (p *Pod) String() string { return p.Namespace + "/" + p.Name }

// IP returns the pod's address of the given family (4 or 6), or the zero
// Addr if the pod has none.
func (p *Pod) IP(family int) netip.Addr {
	if family == 6 {
		return p.IPv6
	}
	return p.IPv4
}

func (c *Config) setDefaults() error {
	if c.Topology == "" {
		c.Topology = Routed
	}
	if c.Topology != Routed && c.Topology != Bridge {
		return fmt.Errorf("testbed: unknown topology %q", c.Topology)
	}
	if !c.IPv4 && !c.IPv6 {
		return errors.New("testbed: at least one of IPv4 and IPv6 must be enabled")
	}
	if !c.PodCIDRv4.IsValid() {
		c.PodCIDRv4 = DefaultPodCIDRv4
	}
	if !c.PodCIDRv6.IsValid() {
		c.PodCIDRv6 = DefaultPodCIDRv6
	}
	c.PodCIDRv4 = c.PodCIDRv4.Masked()
	c.PodCIDRv6 = c.PodCIDRv6.Masked()
	if c.IPv4 && (!c.PodCIDRv4.Addr().Is4() || c.PodCIDRv4.Bits() > 30) {
		return fmt.Errorf("testbed: PodCIDRv4 %s must be an IPv4 prefix of at most /30", c.PodCIDRv4)
	}
	if c.IPv6 && (!c.PodCIDRv6.Addr().Is6() || c.PodCIDRv6.Addr().Is4In6() || c.PodCIDRv6.Bits() > 126) {
		return fmt.Errorf("testbed: PodCIDRv6 %s must be an IPv6 prefix of at most /126", c.PodCIDRv6)
	}
	if c.TCPPorts == nil {
		c.TCPPorts = slices.Clone(DefaultPorts)
	}
	if c.UDPPorts == nil {
		c.UDPPorts = slices.Clone(DefaultPorts)
	}
	if c.SCTPPorts == nil {
		c.SCTPPorts = slices.Clone(DefaultPorts)
	}
	return nil
}

// New creates the node netns (lo up, IPv4/IPv6 forwarding on), the gateway
// interface (a dummy for Routed, a bridge for Bridge) holding the node IPs,
// and starts the node's servers. On error everything created is removed.
func New(cfg Config) (*Bed, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	b := &Bed{
		Timeout:     DefaultTimeout,
		Concurrency: DefaultConcurrency,
		cfg:         cfg,
		id:          "nwtb-" + hex.EncodeToString(rnd[:]),
		usedIP:      map[netip.Addr]bool{},
		nsNames:     map[string]bool{},
		sctpWaiters: map[uint32]*sctpWaiter{},
		sctpPorts:   map[uint16]bool{},
	}
	for _, p := range cfg.SCTPPorts {
		b.sctpPorts[p] = true
	}
	b.local = b.newNode(0, LocalNodeName, b.id+"-node", cfg.PodCIDRv4, cfg.PodCIDRv6)
	if err := b.local.setup(nil); err != nil {
		return nil, errors.Join(fmt.Errorf("testbed: setting up node %s: %w", b.local.NetNSName, err), b.Close())
	}
	return b, nil
}

// macFor derives a stable, locally administered unicast MAC from an IP:
// 0a:<kind>:<last 4 bytes of ip>. Deriving pod MACs from their IP means a
// re-used IP gets the same MAC, so stale neighbour entries stay valid.
func (b *Bed) macFor(kind byte, ip netip.Addr) net.HardwareAddr {
	s := ip.AsSlice()
	s = s[len(s)-4:]
	return net.HardwareAddr{0x0a, kind, s[0], s[1], s[2], s[3]}
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

func addAddr(h *netlink.Handle, l netlink.Link, p netip.Prefix) error {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add address %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// Close stops all servers and deletes every namespace the Bed created,
// including the extra nodes, their pods and the underlay. It is idempotent
// and safe to call after a partially failed New, AddPod or AddNode.
func (b *Bed) Close() error {
	b.closeOnce.Do(func() {
		b.opMu.Lock()
		defer b.opMu.Unlock()
		b.mu.Lock()
		b.closed = true
		nodes := b.nodes
		b.nodes = nil
		b.mu.Unlock()

		var errs []error
		for _, n := range slices.Backward(nodes) {
			errs = append(errs, b.teardownNode(n, true))
		}
		if b.local != nil {
			errs = append(errs, b.teardownNode(b.local, true))
		}
		errs = append(errs, b.teardownUnderlay())
		for name := range b.nsNames {
			if err := deleteNamedNetNS(name); err != nil {
				errs = append(errs, err)
			} else {
				delete(b.nsNames, name)
			}
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// Config returns the effective configuration (with defaults filled in).
func (b *Bed) Config() Config { return b.cfg }

// ID returns the bed's unique prefix ("nwtb-<6 hex>"); all its namespace
// names start with it.
func (b *Bed) ID() string { return b.id }

// NodeNetNSName returns the node netns name, usable with `ip netns exec`.
func (b *Bed) NodeNetNSName() string { return b.local.NetNSName }

// NodeNetNSPath returns "/var/run/netns/<NodeNetNSName()>".
func (b *Bed) NodeNetNSPath() string { return b.local.NetNSPath() }

// NodeIPs returns the node's addresses facing the pods (the first address of
// each enabled pod CIDR, IPv4 first). They are the pods' default gateways.
func (b *Bed) NodeIPs() []netip.Addr { return b.local.NodeIPs() }

// NodeIP returns the node IP of the given family (4 or 6), or the zero Addr.
func (b *Bed) NodeIP(family int) netip.Addr { return b.local.NodeIP(family) }

// InNode runs fn on the calling goroutine with its OS thread locked and
// switched into the node netns; the original netns is restored afterwards.
// Processes started by fn (os/exec) inherit the node netns. Goroutines
// started by fn do NOT run in the node netns.
func (b *Bed) InNode(fn func() error) error { return b.local.InNetNS(fn) }

// NodeExec runs a command inside the node netns (like `ip netns exec`, but
// without remounting /sys) and returns its combined output.
func (b *Bed) NodeExec(ctx context.Context, name string, args ...string) ([]byte, error) {
	return b.local.Exec(ctx, name, args...)
}

// Pods returns the current pods of the local node in creation order (see
// AllPods for the pods of every node).
func (b *Bed) Pods() []*Pod { return b.local.Pods() }

// Pod returns the local node's pod with the given namespace and name, or nil.
func (b *Bed) Pod(namespace, name string) *Pod { return b.local.Pod(namespace, name) }
