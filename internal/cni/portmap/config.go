// Package portmap computes the rules of the netwarden-portmap CNI plugin: DNAT of host ports to a
// container's IPs for traffic addressed to a local address, SNAT of hairpin (and opted-in
// localhost) traffic, per attachment, for the nftables and iptables stores of internal/cni.
package portmap

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/netwarden/netwarden/internal/cni"
)

// Mapping is one validated port mapping.
type Mapping struct {
	HostPort      uint16
	ContainerPort uint16
	Protocol      string // tcp, udp or sctp
	HostIP        netip.Addr
}

// Config is the plugin's own configuration.
type Config struct {
	SNAT         bool
	MasqAll      bool
	ConditionsV4 []string
	ConditionsV6 []string
	// LocalhostHostPorts opts in to host ports on 127.0.0.0/8, which needs route_localnet on
	// the host-side interfaces (a setting with a CVE history, hence off by default).
	LocalhostHostPorts bool
	Mappings           []Mapping
}

type rawMapping struct {
	HostPort      *int   `json:"hostPort"`
	ContainerPort *int   `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP"`
}

type rawConfig struct {
	SNAT               *bool     `json:"snat"`
	MasqAll            bool      `json:"masqAll"`
	ConditionsV4       *[]string `json:"conditionsV4"`
	ConditionsV6       *[]string `json:"conditionsV6"`
	LocalhostHostPorts bool      `json:"localhostHostPorts"`
	RuntimeConfig      struct {
		PortMappings []rawMapping `json:"portMappings"`
	} `json:"runtimeConfig"`
}

// Parse validates the config for the backend kind ("nftables" or "iptables"); errors name the
// field as a JSON path.
func Parse(stdin []byte, kind string) (Config, error) {
	var raw rawConfig
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return Config{}, cni.ConfigError("network configuration", "%v", err)
	}
	cfg := Config{SNAT: raw.SNAT == nil || *raw.SNAT, MasqAll: raw.MasqAll, LocalhostHostPorts: raw.LocalhostHostPorts}
	if cfg.MasqAll && !cfg.SNAT {
		return Config{}, cni.ConfigError("masqAll", "true needs snat, which is false")
	}
	for _, c := range []struct {
		field string
		in    *[]string
		out   *[]string
	}{{"conditionsV4", raw.ConditionsV4, &cfg.ConditionsV4}, {"conditionsV6", raw.ConditionsV6, &cfg.ConditionsV6}} {
		if c.in == nil {
			continue
		}
		if err := validConditions(c.field, *c.in, kind); err != nil {
			return Config{}, err
		}
		*c.out = *c.in
	}
	for i, m := range raw.RuntimeConfig.PortMappings {
		field := fmt.Sprintf("runtimeConfig.portMappings[%d]", i)
		var pm Mapping
		var err error
		if pm.HostPort, err = port(field+".hostPort", m.HostPort); err != nil {
			return Config{}, err
		}
		if pm.ContainerPort, err = port(field+".containerPort", m.ContainerPort); err != nil {
			return Config{}, err
		}
		switch p := strings.ToLower(m.Protocol); p {
		case "":
			pm.Protocol = "tcp"
		case "tcp", "udp", "sctp":
			pm.Protocol = p
		default:
			return Config{}, cni.ConfigError(field+".protocol", "%q: want tcp, udp or sctp", m.Protocol)
		}
		if m.HostIP != "" {
			ip, err := netip.ParseAddr(m.HostIP)
			if err != nil || ip.Zone() != "" {
				return Config{}, cni.ConfigError(field+".hostIP", "%q is not an IP address", m.HostIP)
			}
			ip = ip.Unmap()
			switch {
			case ip.IsUnspecified():
				ip = netip.Addr{} // 0.0.0.0 and :: mean every local address
			case ip.Is6() && ip.IsLoopback():
				return Config{}, cni.ConfigError(field+".hostIP", "%s: IPv6 localhost host ports are not supported", ip)
			case ip.IsLoopback() && !cfg.LocalhostHostPorts:
				return Config{}, cni.ConfigError(field+".hostIP", "%s: localhost host ports need \"localhostHostPorts\": true (it sets route_localnet)", ip)
			case ip.IsMulticast() || ip.IsLinkLocalUnicast():
				return Config{}, cni.ConfigError(field+".hostIP", "%s is not a usable host address", ip)
			}
			pm.HostIP = ip
		}
		cfg.Mappings = append(cfg.Mappings, pm)
	}
	return cfg, nil
}

func port(field string, v *int) (uint16, error) {
	if v == nil {
		return 0, cni.ConfigError(field, "missing")
	}
	if *v < 1 || *v > 65535 {
		return 0, cni.ConfigError(field, "%d is not a port (1-65535)", *v)
	}
	return uint16(*v), nil
}

// validConditions checks that conditions are in the backend's syntax: nft expressions for
// nftables, iptables match arguments (one per element) for iptables.
func validConditions(field string, conds []string, kind string) error {
	for i, c := range conds {
		f := fmt.Sprintf("%s[%d]", field, i)
		if strings.ContainsAny(c, "\n\r;#\"") {
			return cni.ConfigError(f, "%q: newlines, ';', '#' and quotes are not allowed", c)
		}
		t := strings.TrimSpace(c)
		if t == "" {
			return cni.ConfigError(f, "empty condition")
		}
		looksIPT := strings.HasPrefix(t, "-") || t == "!"
		switch kind {
		case "nftables":
			if looksIPT {
				return cni.ConfigError(f, "%q is iptables syntax; the nftables backend wants nft expressions such as \"ip daddr != 192.0.2.0/24\"", c)
			}
			if w := strings.Fields(t)[0]; w == "jump" || w == "goto" || w == "accept" || w == "drop" {
				return cni.ConfigError(f, "%q: a condition must be a match, not a verdict", c)
			}
		case "iptables":
			if i == 0 && !looksIPT {
				return cni.ConfigError(f, "%q is not iptables syntax; the iptables backend wants match arguments such as [\"!\", \"-d\", \"192.0.2.0/24\"]", c)
			}
			if strings.ContainsAny(t, " \t") {
				return cni.ConfigError(f, "%q: give one iptables argument per element", c)
			}
			if t == "-j" || t == "-g" || t == "--jump" || t == "--goto" {
				return cni.ConfigError(f, "%q: a condition must be a match, not a target", c)
			}
		}
	}
	return nil
}
