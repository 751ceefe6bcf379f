package testbed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// InternetIfName is the local node's interface towards the Internet namespace.
const InternetIfName = "eth-inet"

// The link between the local node and the Internet namespace, in documentation ranges: the
// node has host number 1, the Internet side 2.
var (
	internetLinkV4 = netip.MustParsePrefix("192.0.2.0/24")
	internetLinkV6 = netip.MustParsePrefix("2001:db8:ffff::/64")
)

// Internet is a network namespace beyond the local node's default route: the world outside
// the cluster. It holds servers on addresses of its own that report the source address they
// see, which is how masquerading is observed. It routes the local node's pod CIDRs back to
// the node, so traffic that is not masqueraded gets its replies too.
type Internet struct {
	NetNSName string
	// NodeIPs are the node's addresses on the link (IPv4 first): masqueraded traffic to the
	// Internet comes from them.
	NodeIPs []netip.Addr
	// ServerIPs are the addresses the Internet's servers listen on.
	ServerIPs []netip.Addr
	// Port is the servers' TCP port.
	Port uint16

	ns      netns.NsHandle
	servers io.Closer
}

// AddInternet connects the local node to a new Internet namespace whose servers listen on
// serverIPs (addresses outside every pod CIDR), port 8080. The namespace goes away with the
// Bed; Close stops the servers earlier.
func (b *Bed) AddInternet(serverIPs ...netip.Addr) (*Internet, error) {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if b.closed {
		return nil, errors.New("bed is closed")
	}
	inet := &Internet{NetNSName: b.id + "-inet", ServerIPs: serverIPs, Port: 8080}
	if err := b.setupInternet(inet); err != nil {
		return nil, fmt.Errorf("internet %s: %w", inet.NetNSName, err)
	}
	return inet, nil
}

func (b *Bed) setupInternet(inet *Internet) error {
	n := b.local
	var err error
	inet.ns, err = createNamedNetNS(inet.NetNSName)
	if err != nil {
		return err
	}
	b.nsNames[inet.NetNSName] = true
	if err := setSysctls(inet.ns, []sysctl{
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_ra", "0"},
	}); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(inet.ns)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	for _, ip := range inet.ServerIPs {
		if err := addAddr(h, lo, netip.PrefixFrom(ip, ip.BitLen())); err != nil {
			return err
		}
	}

	nodeMAC := net.HardwareAddr{0x0a, 0x5e, 0, 0, 0, 1}
	inetMAC := net.HardwareAddr{0x0a, 0x5e, 0, 0, 0, 2}
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: InternetIfName, HardwareAddr: nodeMAC},
		PeerName:         "eth0",
		PeerHardwareAddr: inetMAC,
		PeerNamespace:    netlink.NsFd(int(inet.ns)),
	}
	if err := n.h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", InternetIfName, err)
	}
	nodeSide, err := n.h.LinkByName(InternetIfName)
	if err != nil {
		return err
	}
	inetSide, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	type family struct {
		link            netip.Prefix
		enabled         bool
		podCIDR, defDst netip.Prefix
		nodeIP, inetIP  netip.Addr
	}
	var fams []family
	if b.cfg.IPv4 {
		fams = append(fams, family{link: internetLinkV4, podCIDR: n.PodCIDRv4, defDst: netip.MustParsePrefix("0.0.0.0/0")})
	}
	if b.cfg.IPv6 {
		fams = append(fams, family{link: internetLinkV6, podCIDR: n.PodCIDRv6, defDst: netip.MustParsePrefix("::/0")})
	}
	for i := range fams {
		f := &fams[i]
		f.nodeIP, f.inetIP = nthAddr(f.link, 1), nthAddr(f.link, 2)
		if err := addAddr(n.h, nodeSide, netip.PrefixFrom(f.nodeIP, f.link.Bits())); err != nil {
			return err
		}
		if err := addAddr(h, inetSide, netip.PrefixFrom(f.inetIP, f.link.Bits())); err != nil {
			return err
		}
		inet.NodeIPs = append(inet.NodeIPs, f.nodeIP)
	}
	if err := n.h.LinkSetUp(nodeSide); err != nil {
		return err
	}
	if err := h.LinkSetUp(inetSide); err != nil {
		return err
	}
	if err := waitLinkReady(n.h, InternetIfName); err != nil {
		return err
	}
	if err := waitLinkReady(h, "eth0"); err != nil {
		return err
	}
	for _, f := range fams {
		// Static neighbours: nothing here depends on ARP or ND getting through.
		if err := n.h.NeighAdd(permNeigh(nodeSide.Attrs().Index, f.inetIP, inetMAC)); err != nil {
			return fmt.Errorf("node neighbour %s: %w", f.inetIP, err)
		}
		if err := h.NeighAdd(permNeigh(inetSide.Attrs().Index, f.nodeIP, nodeMAC)); err != nil {
			return fmt.Errorf("internet neighbour %s: %w", f.nodeIP, err)
		}
		if err := n.h.RouteAdd(&netlink.Route{LinkIndex: nodeSide.Attrs().Index, Dst: prefixToIPNet(f.defDst), Gw: f.inetIP.AsSlice()}); err != nil {
			return fmt.Errorf("node default route via %s: %w", f.inetIP, err)
		}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: inetSide.Attrs().Index, Dst: prefixToIPNet(f.podCIDR), Gw: f.nodeIP.AsSlice()}); err != nil {
			return fmt.Errorf("internet route to %s: %w", f.podCIDR, err)
		}
	}
	var addrs []netip.AddrPort
	for _, ip := range inet.ServerIPs {
		addrs = append(addrs, netip.AddrPortFrom(ip, inet.Port))
	}
	inet.servers, err = startWhoAmI(inet.ns, addrs)
	return err
}

// Close stops the Internet's servers; the namespace itself goes with the Bed.
func (inet *Internet) Close() error {
	if inet.servers != nil {
		return inet.servers.Close()
	}
	return nil
}

// StartWhoAmI runs, in pod p's namespace, a TCP server on each of its IPs at port that
// answers every connection with the source address it sees.
func (p *Pod) StartWhoAmI(port uint16) (io.Closer, error) {
	var addrs []netip.AddrPort
	for _, ip := range p.IPs() {
		addrs = append(addrs, netip.AddrPortFrom(ip, port))
	}
	return startWhoAmI(p.ns, addrs)
}

// SourceSeenBy connects from pod p to a whoami server at dst and returns the source address
// the server saw: p's own address, or the address it was masqueraded to.
func (p *Pod) SourceSeenBy(ctx context.Context, dst netip.AddrPort) (netip.Addr, error) {
	var seen netip.Addr
	err := inNetNSGo(p.ns, func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("reading from %s: %w", dst, err)
		}
		ap, err := netip.ParseAddrPort(strings.TrimSpace(line))
		if err != nil {
			return fmt.Errorf("%s answered %q", dst, line)
		}
		seen = ap.Addr().Unmap()
		return nil
	})
	return seen, err
}

type whoAmI struct {
	listeners []net.Listener
	wg        sync.WaitGroup
}

func startWhoAmI(ns netns.NsHandle, addrs []netip.AddrPort) (io.Closer, error) {
	w := &whoAmI{}
	err := inNetNSGo(ns, func() error {
		lc := net.ListenConfig{Control: freebindControl}
		for _, a := range addrs {
			l, err := lc.Listen(context.Background(), "tcp", a.String())
			if err != nil {
				return err
			}
			w.listeners = append(w.listeners, l)
		}
		return nil
	})
	if err != nil {
		w.Close()
		return nil, err
	}
	for _, l := range w.listeners {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			acceptLoop(l, func(c net.Conn) bool {
				_, _ = fmt.Fprintln(c, c.RemoteAddr().String())
				c.Close()
				return true
			})
		}()
	}
	return w, nil
}

func (w *whoAmI) Close() error {
	for _, l := range w.listeners {
		l.Close()
	}
	w.wg.Wait()
	return nil
}

// InNetNSGo runs fn on a thread in the Internet's namespace: sockets it opens live there.
func (inet *Internet) InNetNSGo(fn func() error) error { return inNetNSGo(inet.ns, fn) }

// AddLocalRange makes every address of p the Internet's own (a local route, as AnyIP): a
// server listening on the unspecified address answers on all of them, so a test can reach
// thousands of distinct addresses.
func (inet *Internet) AddLocalRange(p netip.Prefix) error {
	h, err := netlink.NewHandleAt(inet.ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixToIPNet(p.Masked()), Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("local route %s: %w", p, err)
	}
	return nil
}
