package portmap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/netwarden/netwarden/internal/cni"
)

// Plugin is netwarden-portmap.
type Plugin struct{}

func (Plugin) Name() string             { return "netwarden-portmap" }
func (Plugin) NFTLayout() cni.NFTLayout { return NFTLayout() }
func (Plugin) IPTLayout() cni.IPTLayout { return IPTLayout() }

func (Plugin) Desired(inv *cni.Invocation, kind string) (cni.Desired, error) {
	cfg, err := Parse(inv.Args.StdinData, kind)
	if err != nil {
		return cni.Desired{}, err
	}
	if inv.Result == nil {
		return cni.Desired{}, cni.ConfigError("prevResult", "missing")
	}
	return Desired(inv.Att, cfg, ContainerIPs(inv.Result), kind), nil
}

func (Plugin) AfterAdd(inv *cni.Invocation, _ *cni.Desired) error {
	cfg, err := Parse(inv.Args.StdinData, "")
	if err != nil {
		return err
	}
	if cfg.LocalhostHostPorts && len(cfg.Mappings) > 0 && inv.Result != nil {
		// Packets to 127.0.0.0/8 DNATed to the container leave through the host-side interface,
		// which drops them unless route_localnet is set there.
		for _, itf := range inv.Result.Interfaces {
			if itf.Sandbox != "" || itf.Name == "" {
				continue
			}
			p := filepath.Join("/proc/sys/net/ipv4/conf", itf.Name, "route_localnet")
			if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("set %s: %w", p, err)
			}
		}
	}
	return flushUDP(cfg.Mappings, families(inv))
}

func (Plugin) AfterDel(inv *cni.Invocation, _ *cni.Desired) error {
	cfg, err := Parse(inv.Args.StdinData, "")
	if err != nil {
		return err
	}
	return flushUDP(cfg.Mappings, families(inv))
}

// families lists the conntrack families the container's mappings can have entries in: those of
// its IPs, or both when DEL comes without a prevResult.
func families(inv *cni.Invocation) []netlink.InetFamily {
	if inv.Result == nil {
		return []netlink.InetFamily{netlink.FAMILY_V4, netlink.FAMILY_V6}
	}
	var v4, v6 bool
	for _, p := range ContainerIPs(inv.Result) {
		v4, v6 = v4 || p.Addr().Is4(), v6 || p.Addr().Is6()
	}
	var out []netlink.InetFamily
	if v4 {
		out = append(out, netlink.FAMILY_V4)
	}
	if v6 {
		out = append(out, netlink.FAMILY_V6)
	}
	return out
}

// flushUDP deletes conntrack entries of UDP traffic to the mapped host ports: UDP "connections"
// that predate the change would otherwise keep their old translation (or none) until they idle
// out, so a client that keeps sending never reaches the new container.
func flushUDP(mappings []Mapping, fams []netlink.InetFamily) error {
	var errs []error
	for _, fam := range fams {
		// One dump per family with every mapping's filter: a dump walks the whole conntrack
		// table, which is shared by all network namespaces, so it is the cost that counts.
		var filters []netlink.CustomConntrackFilter
		for _, m := range mappings {
			if m.Protocol != "udp" || (m.HostIP.IsValid() && m.HostIP.Is4() != (fam == netlink.FAMILY_V4)) {
				continue
			}
			f := &netlink.ConntrackFilter{}
			if err := f.AddProtocol(17); err != nil {
				return err
			}
			if err := f.AddPort(netlink.ConntrackOrigDstPort, m.HostPort); err != nil {
				return err
			}
			if m.HostIP.IsValid() {
				if err := f.AddIP(netlink.ConntrackOrigDstIP, net.IP(m.HostIP.AsSlice())); err != nil {
					return err
				}
			}
			filters = append(filters, f)
		}
		if len(filters) == 0 {
			continue
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...); err != nil {
			errs = append(errs, fmt.Errorf("conntrack: flush UDP to host ports: %w", err))
		}
	}
	return errors.Join(errs...)
}
