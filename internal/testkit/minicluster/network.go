package minicluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// The cluster's addresses: private ranges, and only inside the namespaces the cluster creates.
var (
	// UnderlayPrefix is the nodes' network: the underlay netns holds UnderlayGateway on its
	// bridge (the egress proxy dials the kubelets from there), node k holds the k-th address
	// from underlayFirstNode.
	UnderlayPrefix  = netip.MustParsePrefix("10.200.0.0/24")
	UnderlayGateway = netip.MustParseAddr("10.200.0.1")
	// ClusterCIDR holds every node's pod CIDR: node k (from 0) has 10.244.k.0/24.
	ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
)

const (
	underlayFirstNode = 10
	underlayBridge    = "ul0"
	uplinkName        = "eth0"
	// MaxNodes is bounded by the pod CIDRs (one /24 of ClusterCIDR each) and the underlay.
	MaxNodes = 200
)

func nodeUnderlayIP(k int) netip.Addr {
	a := UnderlayPrefix.Addr().As4()
	a[3] = byte(underlayFirstNode + k)
	return netip.AddrFrom4(a)
}

func nodePodCIDR(k int) netip.Prefix {
	a := ClusterCIDR.Addr().As4()
	a[2] = byte(k)
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// netNS is a named network namespace the cluster created.
type netNS struct {
	name string
	h    netns.NsHandle
}

func newNetNS(name string, sysctls map[string]string) (*netNS, error) {
	h, err := testbed.CreateNetNS(name)
	if err != nil {
		return nil, err
	}
	n := &netNS{name: name, h: h}
	err = n.do(func() error {
		for k, v := range sysctls {
			p := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s in %s: %w", k, v, name, err)
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		n.remove()
		return nil, err
	}
	return n, nil
}

func (n *netNS) path() string { return filepath.Join(testbed.NetNSDir, n.name) }

// do runs fn on a thread inside the namespace.
func (n *netNS) do(fn func() error) error { return testbed.InNetNSGo(n.h, fn) }

func (n *netNS) remove() error {
	n.h.Close()
	return testbed.RemoveNetNSMount(n.path())
}

// underlay is the network joining the nodes: a bridge in a namespace of its own.
type underlay struct{ ns *netNS }

func newUnderlay(id string) (*underlay, error) {
	ns, err := newNetNS(id+"-underlay", map[string]string{"net.ipv4.ip_forward": "0"})
	if err != nil {
		return nil, err
	}
	u := &underlay{ns: ns}
	err = ns.do(func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: underlayBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("underlay bridge: %w", err)
		}
		addr := &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(UnderlayGateway, UnderlayPrefix.Bits()))}
		if err := netlink.AddrAdd(br, addr); err != nil {
			return fmt.Errorf("underlay address: %w", err)
		}
		return netlink.LinkSetUp(br)
	})
	if err != nil {
		ns.remove()
		return nil, err
	}
	return u, nil
}

// attach wires node k's namespace to the underlay: a veth whose node end is eth0 with the
// node's underlay address, a default route through the underlay gateway (kube-proxy and the
// kernel's route lookup before DNAT need one), and a route to every other node's pod CIDR.
func (u *underlay) attach(node *netNS, k, nodes int) error {
	peer := fmt.Sprintf("n%d", k)
	err := u.ns.do(func() error {
		br, err := netlink.LinkByName(underlayBridge)
		if err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer, MasterIndex: br.Attrs().Index}, PeerName: uplinkName, PeerNamespace: netlink.NsFd(int(node.h))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("uplink of node %d: %w", k, err)
		}
		return netlink.LinkSetUp(veth)
	})
	if err != nil {
		return err
	}
	return node.do(func() error {
		up, err := netlink.LinkByName(uplinkName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(nodeUnderlayIP(k), UnderlayPrefix.Bits()))}); err != nil {
			return fmt.Errorf("underlay address of node %d: %w", k, err)
		}
		if err := netlink.LinkSetUp(up); err != nil {
			return err
		}
		routes := []netlink.Route{{LinkIndex: up.Attrs().Index, Gw: net.IP(UnderlayGateway.AsSlice())}}
		for j := range nodes {
			if j != k {
				routes = append(routes, netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixNet(nodePodCIDR(j)), Gw: net.IP(nodeUnderlayIP(j).AsSlice())})
			}
		}
		for _, r := range routes {
			if err := netlink.RouteAdd(&r); err != nil {
				return fmt.Errorf("route %v of node %d: %w", r, k, err)
			}
		}
		return nil
	})
}

func (u *underlay) remove() error { return u.ns.remove() }

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// removeAll removes namespaces, reporting every failure.
func removeAll(nss ...*netNS) error {
	var errs []error
	for _, n := range nss {
		if n != nil {
			errs = append(errs, n.remove())
		}
	}
	return errors.Join(errs...)
}
