package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// UplinkIfName is the name of every node's veth into the underlay.
const UplinkIfName = "eth-underlay"

const underlayBridgeName = "ul-br0"

// The underlay's subnets: node k (0 = local) has host number k+1 in both.
var (
	underlayCIDRv4 = netip.MustParsePrefix("10.255.0.0/24")
	underlayCIDRv6 = netip.MustParsePrefix("fd00:255::/64")
)

// underlay is the netns with the bridge joining all nodes' uplinks.
type underlay struct {
	name string
	ns   netns.NsHandle
	h    *netlink.Handle
}

// UnderlayIPs returns the local node's underlay addresses (IPv4 first), or
// nil before the first AddNode.
func (b *Bed) UnderlayIPs() []netip.Addr { return b.local.UnderlayIPs() }

// UnderlayNetNSName returns the name of the underlay netns (which holds
// only a bridge joining the nodes' uplinks). It exists from the first
// successful AddNode until Close.
func (b *Bed) UnderlayNetNSName() string { return b.id + "-underlay" }

// hostNum is n's host number on the underlay subnets.
func (n *Node) hostNum() int { return n.index + 1 }

// uplinkMAC is the MAC of the uplink of the node with host number h: every
// node knows every other's statically, so nothing needs ARP/ND.
func uplinkMAC(h int) net.HardwareAddr {
	return net.HardwareAddr{0x0a, 0x5a, 0, 0, byte(h >> 8), byte(h)}
}

// ensureUnderlay creates the underlay netns and bridge and attaches the
// local node, unless that was done before. On error nothing of it is left.
// Caller holds opMu.
func (b *Bed) ensureUnderlay() error {
	if b.ul != nil {
		return nil
	}
	u := &underlay{name: b.UnderlayNetNSName(), ns: netns.None()}
	if err := b.setupUnderlay(u); err != nil {
		return errors.Join(fmt.Errorf("underlay %s: %w", u.name, err), b.deleteUnderlay(u))
	}
	b.ul = u
	if err := b.attachUnderlay(b.local); err != nil {
		return errors.Join(fmt.Errorf("attaching local node to the underlay: %w", err), b.detachUnderlay(b.local), b.teardownUnderlay())
	}
	return nil
}

func (b *Bed) setupUnderlay(u *underlay) error {
	var err error
	u.ns, err = createNamedNetNS(u.name)
	if err != nil {
		return err
	}
	b.nsNames[u.name] = true
	// Pure L2: no IPv6 on the bridge and its ports (no link-local
	// addresses, MLD or ND of their own), no netfilter for bridged frames.
	if err := setSysctls(u.ns, []sysctl{
		{"net.ipv6.conf.all.disable_ipv6", "1"},
		{"net.ipv6.conf.default.disable_ipv6", "1"},
	}); err != nil {
		return err
	}
	if err := inNetNSGo(u.ns, func() error {
		for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"} {
			// Present only if br_netfilter is loaded.
			if err := os.WriteFile("/proc/sys/net/bridge/"+k, []byte("0"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("sysctl net.bridge.%s=0: %w", k, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	u.h, err = netlink.NewHandleAt(u.ns)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	if err := linkUp(u.h, "lo"); err != nil {
		return err
	}
	snoop := false
	br := &netlink.Bridge{
		LinkAttrs:         netlink.LinkAttrs{Name: underlayBridgeName, HardwareAddr: net.HardwareAddr{0x0a, 0x5c, 0, 0, 0, 0}},
		MulticastSnooping: &snoop,
	}
	if err := u.h.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", underlayBridgeName, err)
	}
	// Up before any port joins, so that ports start forwarding as soon as
	// they have carrier.
	return linkUp(u.h, underlayBridgeName)
}

// teardownUnderlay removes the underlay (whose ports vanish with it).
// Caller holds opMu.
func (b *Bed) teardownUnderlay() error {
	u := b.ul
	b.ul = nil
	if u == nil {
		return nil
	}
	return b.deleteUnderlay(u)
}

func (b *Bed) deleteUnderlay(u *underlay) error {
	if u.h != nil {
		u.h.Close()
		u.h = nil
	}
	if u.ns.IsOpen() {
		u.ns.Close()
	}
	if !b.nsNames[u.name] {
		return nil
	}
	if err := deleteNamedNetNS(u.name); err != nil {
		return err
	}
	delete(b.nsNames, u.name)
	return nil
}

// attachUnderlay connects node n to the underlay: the uplink veth (with its
// peer enslaved to the underlay bridge), its addresses, static neighbours
// and pod CIDR routes between n and every other attached node in both
// directions, and servers on the underlay addresses. On error the caller
// runs detachUnderlay(n). Caller holds opMu.
func (b *Bed) attachUnderlay(n *Node) error {
	u := b.ul
	h := n.hostNum()
	var ips []netip.Addr
	if b.cfg.IPv4 {
		ips = append(ips, nthAddr(underlayCIDRv4, h))
	}
	if b.cfg.IPv6 {
		ips = append(ips, nthAddr(underlayCIDRv6, h))
	}
	b.mu.Lock()
	n.ulIPs = ips
	b.mu.Unlock()

	portName := fmt.Sprintf("ulp%d", h)
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: UplinkIfName, HardwareAddr: uplinkMAC(h)},
		PeerName:         portName,
		PeerHardwareAddr: net.HardwareAddr{0x0a, 0x5b, 0, 0, byte(h >> 8), byte(h)},
		PeerNamespace:    netlink.NsFd(int(u.ns)),
	}
	if err := n.h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", UplinkIfName, err)
	}
	port, err := u.h.LinkByName(portName)
	if err != nil {
		return err
	}
	br, err := u.h.LinkByName(underlayBridgeName)
	if err != nil {
		return err
	}
	if err := u.h.LinkSetMaster(port, br); err != nil {
		return fmt.Errorf("enslave %s to %s: %w", portName, underlayBridgeName, err)
	}
	if err := u.h.LinkSetUp(port); err != nil {
		return fmt.Errorf("set %s up: %w", portName, err)
	}
	// Loose or no reverse-path filtering for traffic routed between nodes
	// (strict would pass too, as all routes are symmetric; this is belt
	// and braces against inherited settings).
	if err := setSysctls(n.ns, []sysctl{
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf." + UplinkIfName + ".rp_filter", "0"},
	}); err != nil {
		return err
	}
	up, err := n.h.LinkByName(UplinkIfName)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if err := addAddr(n.h, up, netip.PrefixFrom(ip, underlayCIDR(ip).Bits())); err != nil {
			return err
		}
	}
	if err := n.h.LinkSetUp(up); err != nil {
		return fmt.Errorf("set %s up: %w", UplinkIfName, err)
	}
	if err := waitLinkReady(n.h, UplinkIfName); err != nil {
		return err
	}
	if err := waitLinkReady(u.h, portName); err != nil {
		return err
	}

	for _, m := range b.attachedNodes() {
		if m == n {
			continue
		}
		if err := connectNodes(n, m); err != nil {
			return err
		}
		if err := connectNodes(m, n); err != nil {
			return err
		}
	}

	n.ulSrv, err = b.startServers(n.ns, ips)
	return err
}

// attachedNodes returns the nodes (local first) that have started
// attaching to the underlay and are not torn down.
func (b *Bed) attachedNodes() []*Node {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []*Node
	for _, m := range append([]*Node{b.local}, b.nodes...) {
		if len(m.ulIPs) > 0 && m.h != nil {
			out = append(out, m)
		}
	}
	return out
}

// connectNodes installs, in from, static neighbours for to's underlay
// addresses and routes for to's pod CIDRs via them.
func connectNodes(from, to *Node) error {
	up, err := from.h.LinkByName(UplinkIfName)
	if err != nil {
		return fmt.Errorf("node %s: %w", from.Name, err)
	}
	for _, gw := range to.ulIPs {
		if err := from.h.NeighAdd(permNeigh(up.Attrs().Index, gw, uplinkMAC(to.hostNum()))); err != nil {
			return fmt.Errorf("node %s: neighbour %s: %w", from.Name, gw, err)
		}
		dst := to.cidr(gw)
		r := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixToIPNet(dst), Gw: gw.AsSlice()}
		if err := from.h.RouteAdd(r); err != nil {
			return fmt.Errorf("node %s: route %s via %s: %w", from.Name, dst, gw, err)
		}
	}
	return nil
}

// disconnectNodes undoes connectNodes(from, to); missing entries are fine.
func disconnectNodes(from, to *Node) error {
	up, err := from.h.LinkByName(UplinkIfName)
	if err != nil {
		return nil // no uplink, so nothing via it either
	}
	var errs []error
	for _, gw := range to.ulIPs {
		dst := to.cidr(gw)
		r := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixToIPNet(dst), Gw: gw.AsSlice()}
		if err := from.h.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("node %s: delete route %s: %w", from.Name, dst, err))
		}
		if err := from.h.NeighDel(permNeigh(up.Attrs().Index, gw, nil)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("node %s: delete neighbour %s: %w", from.Name, gw, err))
		}
	}
	return errors.Join(errs...)
}

// detachUnderlay undoes attachUnderlay(n), also when it was partial: the
// routes to n on the other nodes, n's underlay servers and its uplink
// (deleting it synchronously removes the underlay-side port too). Caller
// holds opMu.
func (b *Bed) detachUnderlay(n *Node) error {
	b.mu.RLock()
	attached := len(n.ulIPs) > 0
	b.mu.RUnlock()
	if !attached {
		return nil
	}
	var errs []error
	if n.ulSrv != nil {
		n.ulSrv.close()
		n.ulSrv = nil
	}
	for _, m := range b.attachedNodes() {
		if m != n {
			errs = append(errs, disconnectNodes(m, n))
		}
	}
	if n.h != nil {
		if l, err := n.h.LinkByName(UplinkIfName); err == nil {
			if err := n.h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete %s: %w", UplinkIfName, err))
			}
		}
	}
	b.mu.Lock()
	n.ulIPs = nil
	b.mu.Unlock()
	return errors.Join(errs...)
}

func underlayCIDR(ip netip.Addr) netip.Prefix {
	if ip.Is4() {
		return underlayCIDRv4
	}
	return underlayCIDRv6
}

// nthAddr returns the address with host number k in p.
func nthAddr(p netip.Prefix, k int) netip.Addr {
	a := p.Masked().Addr()
	for range k {
		a = a.Next()
	}
	return a
}
