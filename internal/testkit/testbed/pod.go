package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/netipx"
)

// allocIP returns the lowest free address of prefix (skipping the network
// address, the node IP and, for IPv4, the broadcast address). Caller holds b.mu.
func (b *Bed) allocIP(prefix netip.Prefix) (netip.Addr, error) {
	last := netipx.LastAddr(prefix)
	for ip := prefix.Addr().Next(); ip.IsValid() && prefix.Contains(ip); ip = ip.Next() {
		if ip.Is4() && ip == last {
			break
		}
		if !b.usedIP[ip] {
			b.usedIP[ip] = true
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("testbed: pod CIDR %s exhausted", prefix)
}

func sanitize(s string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			sb.WriteRune(r)
		default:
			sb.WriteRune('-')
		}
	}
	out := sb.String()
	if len(out) > 40 {
		out = out[:40]
	}
	return out
}

// AddPod creates a pod netns connected to the local node, allocates the next
// free IPs from the pod CIDRs, sets lo up, installs default routes via the
// node IPs and starts the pod's servers.
func (b *Bed) AddPod(namespace, name string) (*Pod, error) { return b.local.AddPod(namespace, name) }

// AddPod creates a pod netns connected to node n, wired like the local
// node's pods (per the bed's Topology), with the next free IPs from n's pod
// CIDRs, default routes via n's node IPs and its servers started.
// Namespace/name must be unique across all nodes of the bed.
func (n *Node) AddPod(namespace, name string) (*Pod, error) {
	b := n.bed
	b.opMu.Lock()
	defer b.opMu.Unlock()

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errors.New("testbed: bed is closed")
	}
	if n.removed {
		b.mu.Unlock()
		return nil, fmt.Errorf("testbed: node %s was removed", n.Name)
	}
	if b.findPodLocked(namespace, name) != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("testbed: pod %s/%s already exists", namespace, name)
	}
	b.podSeq++
	seq := b.podSeq
	p := &Pod{
		Namespace:  namespace,
		Name:       name,
		NetNSName:  fmt.Sprintf("%s-p%d-%s-%s", b.id, seq, sanitize(namespace), sanitize(name)),
		HostIfName: fmt.Sprintf("tbv%d", seq),
		node:       n,
		ns:         netns.None(),
	}
	var err error
	if b.cfg.IPv4 {
		p.IPv4, err = b.allocIP(n.PodCIDRv4)
	}
	if err == nil && b.cfg.IPv6 {
		p.IPv6, err = b.allocIP(n.PodCIDRv6)
	}
	b.mu.Unlock()

	if err == nil {
		err = b.setupPod(p)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("testbed: adding pod %s/%s: %w", namespace, name, err), b.teardownPod(p))
	}
	b.mu.Lock()
	n.pods = append(n.pods, p)
	b.mu.Unlock()
	return p, nil
}

// findPodLocked returns the pod namespace/name on any node, or nil. Caller
// holds b.mu.
func (b *Bed) findPodLocked(namespace, name string) *Pod {
	for _, n := range append([]*Node{b.local}, b.nodes...) {
		for _, p := range n.pods {
			if p.Namespace == namespace && p.Name == name {
				return p
			}
		}
	}
	return nil
}

func (b *Bed) setupPod(p *Pod) error {
	n := p.node
	var err error
	p.ns, err = createNamedNetNS(p.NetNSName)
	if err != nil {
		return err
	}
	b.nsNames[p.NetNSName] = true
	if err := setSysctls(p.ns, []sysctl{
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_ra", "0"},
		{"net.ipv6.conf.default.router_solicitations", "0"},
	}); err != nil {
		return err
	}
	podH, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer podH.Close()
	if err := linkUp(podH, "lo"); err != nil {
		return err
	}

	ips := p.IPs()
	podMAC := b.macFor(0x58, ips[0])
	hostMAC := b.macFor(0x59, ips[0])
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: p.HostIfName, HardwareAddr: hostMAC},
		PeerName:         podIfName,
		PeerHardwareAddr: podMAC,
		PeerNamespace:    netlink.NsFd(int(p.ns)),
	}
	if err := n.h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", p.HostIfName, err)
	}
	host, err := n.h.LinkByName(p.HostIfName)
	if err != nil {
		return err
	}
	if b.cfg.Topology == Bridge {
		br, err := n.h.LinkByName(bridgeIfName)
		if err != nil {
			return err
		}
		if err := n.h.LinkSetMaster(host, br); err != nil {
			return fmt.Errorf("enslave %s to %s: %w", p.HostIfName, bridgeIfName, err)
		}
	}
	if err := n.h.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", p.HostIfName, err)
	}

	eth, err := podH.LinkByName(podIfName)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		bits := ip.BitLen()
		if b.cfg.Topology == Bridge {
			bits = n.cidr(ip).Bits()
		}
		if err := addAddr(podH, eth, netip.PrefixFrom(ip, bits)); err != nil {
			return err
		}
	}
	if err := podH.LinkSetUp(eth); err != nil {
		return fmt.Errorf("set pod %s up: %w", podIfName, err)
	}

	for _, ip := range ips {
		gw := n.NodeIP(family(ip))
		r := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice()}
		if b.cfg.Topology == Routed {
			r.Flags = int(netlink.FLAG_ONLINK)
			// Static neighbour for the gateway: no ARP/ND needed at all on
			// the ptp link, so there is nothing to warm up.
			if err := podH.NeighAdd(permNeigh(eth.Attrs().Index, gw, hostMAC)); err != nil {
				return fmt.Errorf("pod neighbour %s: %w", gw, err)
			}
			// Host side: /32 or /128 route plus a static neighbour.
			hr := &netlink.Route{
				LinkIndex: host.Attrs().Index,
				Dst:       prefixToIPNet(netip.PrefixFrom(ip, ip.BitLen())),
				Scope:     netlink.SCOPE_LINK,
			}
			if err := n.h.RouteAdd(hr); err != nil {
				return fmt.Errorf("node route to %s: %w", ip, err)
			}
			if err := n.h.NeighAdd(permNeigh(host.Attrs().Index, ip, podMAC)); err != nil {
				return fmt.Errorf("node neighbour %s: %w", ip, err)
			}
		}
		if err := podH.RouteAdd(r); err != nil {
			return fmt.Errorf("pod default route via %s: %w", gw, err)
		}
	}

	if err := waitLinkReady(n.h, p.HostIfName); err != nil {
		return err
	}
	if err := waitLinkReady(podH, podIfName); err != nil {
		return err
	}
	if b.cfg.Topology == Bridge {
		if err := waitLinkReady(n.h, bridgeIfName); err != nil {
			return err
		}
	}

	p.srv, err = b.startServers(p.ns, ips)
	return err
}

func family(ip netip.Addr) int {
	if ip.Is4() {
		return 4
	}
	return 6
}

func permNeigh(ifindex int, ip netip.Addr, mac net.HardwareAddr) *netlink.Neigh {
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	return &netlink.Neigh{
		LinkIndex:    ifindex,
		Family:       fam,
		State:        netlink.NUD_PERMANENT,
		IP:           ip.AsSlice(),
		HardwareAddr: mac,
	}
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// RemovePod stops the pod's servers, deletes its veth and netns and releases
// its IPs. The pod may be on any node of the bed.
func (b *Bed) RemovePod(p *Pod) error {
	if p.node == nil || p.node.bed != b {
		return fmt.Errorf("testbed: pod %s/%s not in bed", p.Namespace, p.Name)
	}
	found, err := p.node.removePod(p)
	if !found {
		return fmt.Errorf("testbed: pod %s/%s not in bed", p.Namespace, p.Name)
	}
	return err
}

// RemovePod stops the pod's servers, deletes its veth and netns and releases
// its IPs. The pod must be on node n.
func (n *Node) RemovePod(p *Pod) error {
	found, err := n.removePod(p)
	if !found {
		return fmt.Errorf("testbed: pod %s/%s not on node %s", p.Namespace, p.Name, n.Name)
	}
	return err
}

// removePod reports whether p was one of n's pods, and the teardown error.
func (n *Node) removePod(p *Pod) (bool, error) {
	b := n.bed
	b.opMu.Lock()
	defer b.opMu.Unlock()
	b.mu.Lock()
	i := slices.Index(n.pods, p)
	if i < 0 {
		b.mu.Unlock()
		return false, nil
	}
	n.pods = append(n.pods[:i:i], n.pods[i+1:]...)
	b.mu.Unlock()
	return true, b.teardownPod(p)
}

// teardownPod releases everything setupPod may have created. Caller holds opMu.
func (b *Bed) teardownPod(p *Pod) error {
	var errs []error
	if p.srv != nil {
		p.srv.close()
		p.srv = nil
	}
	// Deleting the host side synchronously removes both veth ends together
	// with their routes/neighbours; netns teardown alone is asynchronous.
	if h := p.node.h; h != nil && p.HostIfName != "" {
		if l, err := h.LinkByName(p.HostIfName); err == nil {
			if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete %s: %w", p.HostIfName, err))
			}
		}
	}
	b.mu.Lock()
	if p.ns.IsOpen() {
		p.ns.Close()
	}
	b.mu.Unlock()
	if b.nsNames[p.NetNSName] {
		if err := deleteNamedNetNS(p.NetNSName); err != nil {
			errs = append(errs, err)
		} else {
			delete(b.nsNames, p.NetNSName)
		}
	}
	b.mu.Lock()
	for _, ip := range p.IPs() {
		delete(b.usedIP, ip)
	}
	b.mu.Unlock()
	return errors.Join(errs...)
}

// linkReadyTimeout bounds waitLinkReady.
const linkReadyTimeout = 5 * time.Second

// waitLinkReady waits until a link is operationally up and has no tentative
// IPv6 address. After carrier-on the kernel activates a device's TX queues
// asynchronously (linkwatch, which may lag by up to a second for non-urgent
// events such as a bridge's carrier change); until then packets sent through
// the device are silently dropped by the noop qdisc. linkwatch sets the
// operstate right before activating the queues, so operstate UP is a good
// proxy for "ready".
func waitLinkReady(h *netlink.Handle, name string) error {
	deadline := time.Now().Add(linkReadyTimeout)
	var why string
	for {
		l, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		why = ""
		if st := l.Attrs().OperState; st != netlink.OperUp {
			why = "operstate " + st.String()
		} else if addrs, err := h.AddrList(l, netlink.FAMILY_V6); err != nil {
			why = err.Error()
		} else {
			for _, a := range addrs {
				if a.Flags&unix.IFA_F_TENTATIVE != 0 {
					why = "tentative address " + a.IP.String()
				}
			}
		}
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s not ready after %v: %s", name, linkReadyTimeout, why)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
