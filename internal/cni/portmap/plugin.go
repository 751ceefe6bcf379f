package portmap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/cni"
	"github.com/netwarden/netwarden/internal/kernel/conntrack"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
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
	return Desired(inv.Att, cfg, cni.ContainerIPs(inv.Result), kind), nil
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
	v4, v6 := families(inv)
	return flushUDP(inv, cfg.Mappings, v4, v6)
}

func (Plugin) AfterDel(inv *cni.Invocation, _ *cni.Desired) error {
	cfg, err := Parse(inv.Args.StdinData, "")
	if err != nil {
		return err
	}
	v4, v6 := families(inv)
	return flushUDP(inv, cfg.Mappings, v4, v6)
}

// families says which conntrack families the container's mappings can have entries in: those
// of its IPs, or both when DEL comes without a prevResult.
func families(inv *cni.Invocation) (v4, v6 bool) {
	if inv.Result == nil {
		return true, true
	}
	for _, p := range cni.ContainerIPs(inv.Result) {
		v4, v6 = v4 || p.Addr().Is4(), v6 || p.Addr().Is6()
	}
	return v4, v6
}

// flushUDP deletes conntrack entries of UDP traffic to the mapped host ports: UDP "connections"
// that predate the change would otherwise keep their old translation (or none) until they idle
// out, so a client that keeps sending never reaches the new container.
//
// The socket is released, not closed: the plugin exits right after, and a close here would
// wait for the kernel to free what the DEL's nftables commit deleted (see nftnl.Conn).
func flushUDP(inv *cni.Invocation, mappings []Mapping, v4, v6 bool) error {
	var matches []conntrack.Match
	for _, m := range mappings {
		if m.Protocol != "udp" {
			continue
		}
		cm := conntrack.Match{Protocol: unix.IPPROTO_UDP, DstPort: uint16(m.HostPort), IPv4: v4, IPv6: v6}
		if m.HostIP.IsValid() {
			cm.Dst = m.HostIP
			cm.IPv4, cm.IPv6 = v4 && m.HostIP.Is4(), v6 && m.HostIP.Is6()
		}
		if cm.IPv4 || cm.IPv6 {
			matches = append(matches, cm)
		}
	}
	if len(matches) == 0 {
		return nil
	}
	sock, err := nftnl.DialRaw()
	if err != nil {
		return fmt.Errorf("conntrack: flush UDP to host ports: %w", err)
	}
	inv.ReleaseWhenDone(sock.Release)
	if err := conntrack.Delete(sock, matches); err != nil {
		return fmt.Errorf("flush UDP to host ports: %w", err)
	}
	return nil
}
