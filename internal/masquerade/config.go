// Package masquerade decides which pod traffic leaves the node with the node's address (SNAT) and
// programs that decision into the kernel. The decision is configured like ip-masq-agent (the
// same file format, defaults and flags), and extended with what the agent knows: every Node's
// podCIDRs are never masqueraded as destinations, and only this node's pods are masqueraded as
// sources. The result is a backend-neutral Desired state that the nftables and iptables
// backends render; a change is one kernel transaction, and the rules a packet crosses do not
// grow with the number of CIDRs.
package masquerade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Config is the ip-masq-agent configuration file, field for field.
type Config struct {
	// NonMasqueradeCIDRs are destinations that keep the pod's address, both families.
	NonMasqueradeCIDRs []netip.Prefix
	// CidrLimit bounds len(NonMasqueradeCIDRs), to catch a file that lists far more than meant.
	CidrLimit int
	// MasqLinkLocal masquerades traffic to 169.254.0.0/16 too; MasqLinkLocalIPv6 to fe80::/10.
	MasqLinkLocal     bool
	MasqLinkLocalIPv6 bool
	// ResyncInterval is how often the kernel is checked for our rules (ip-masq-agent rewrote
	// them at that interval; we only repair what was lost).
	ResyncInterval time.Duration
}

// The link-local ranges that are exempt unless MasqLinkLocal / MasqLinkLocalIPv6 are set.
var (
	LinkLocalV4 = netip.MustParsePrefix("169.254.0.0/16")
	LinkLocalV6 = netip.MustParsePrefix("fe80::/10")
)

// privateRanges are ip-masq-agent's default non-masquerade destinations (RFC 1918).
var privateRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}

// ReservedRanges are the IPv4 ranges that --nomasq-all-reserved-ranges adds to the defaults,
// the same list as ip-masq-agent's flag.
var ReservedRanges = []string{
	"100.64.0.0/10",   // RFC 6598, shared address space
	"192.0.0.0/24",    // RFC 6890, IETF protocol assignments
	"192.0.2.0/24",    // RFC 5737, TEST-NET-1
	"192.88.99.0/24",  // RFC 7526, 6to4 relay anycast
	"198.18.0.0/15",   // RFC 6815, benchmarking
	"198.51.100.0/24", // RFC 5737, TEST-NET-2
	"203.0.113.0/24",  // RFC 5737, TEST-NET-3
	"240.0.0.0/4",     // RFC 5735, former class E
}

// DefaultConfig is what ip-masq-agent uses when there is no file, and what every field missing
// from a file falls back to.
func DefaultConfig(allReservedRanges bool) Config {
	ranges := privateRanges
	if allReservedRanges {
		ranges = append(append([]string{}, privateRanges...), ReservedRanges...)
	}
	c := Config{CidrLimit: 64, ResyncInterval: 60 * time.Second}
	for _, r := range ranges {
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, netip.MustParsePrefix(r))
	}
	return c
}

// fileConfig is the file's JSON shape. Pointers tell a missing field (default) from a zero one.
type fileConfig struct {
	NonMasqueradeCIDRs *[]string `json:"nonMasqueradeCIDRs"`
	CidrLimit          *int      `json:"cidrLimit"`
	MasqLinkLocal      *bool     `json:"masqLinkLocal"`
	MasqLinkLocalIPv6  *bool     `json:"masqLinkLocalIPv6"`
	ResyncInterval     *string   `json:"resyncInterval"`
}

// ParseConfig reads a config in YAML or JSON. Fields that are absent take ip-masq-agent's
// defaults; unknown fields are rejected, because a misspelt field silently taking its default
// would change what gets masqueraded. Errors name the field and the offending value.
func ParseConfig(data []byte, allReservedRanges bool) (Config, error) {
	c := DefaultConfig(allReservedRanges)
	if len(bytes.TrimSpace(data)) == 0 {
		return c, nil
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return Config{}, fmt.Errorf("not valid YAML or JSON: %w", err)
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return c, nil
	}
	var f fileConfig
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Config{}, fmt.Errorf("field %s: a %s cannot hold %s", te.Field, te.Type, te.Value)
		}
		if msg, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return Config{}, fmt.Errorf("unknown field %s (want nonMasqueradeCIDRs, cidrLimit, masqLinkLocal, masqLinkLocalIPv6 or resyncInterval)", msg)
		}
		return Config{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Config{}, errors.New("more than one document")
	}
	if f.NonMasqueradeCIDRs != nil {
		c.NonMasqueradeCIDRs = nil
		for i, s := range *f.NonMasqueradeCIDRs {
			p, err := ParseAlignedCIDR(s)
			if err != nil {
				return Config{}, fmt.Errorf("nonMasqueradeCIDRs[%d]: %w", i, err)
			}
			c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, p)
		}
	}
	if f.CidrLimit != nil {
		if *f.CidrLimit < 0 {
			return Config{}, fmt.Errorf("cidrLimit: %d is negative", *f.CidrLimit)
		}
		c.CidrLimit = *f.CidrLimit
	}
	if f.MasqLinkLocal != nil {
		c.MasqLinkLocal = *f.MasqLinkLocal
	}
	if f.MasqLinkLocalIPv6 != nil {
		c.MasqLinkLocalIPv6 = *f.MasqLinkLocalIPv6
	}
	if f.ResyncInterval != nil {
		d, err := time.ParseDuration(*f.ResyncInterval)
		if err != nil {
			return Config{}, fmt.Errorf("resyncInterval: %q is not a duration such as 60s", *f.ResyncInterval)
		}
		if d <= 0 {
			return Config{}, fmt.Errorf("resyncInterval: %q must be positive", *f.ResyncInterval)
		}
		c.ResyncInterval = d
	}
	if n := len(c.NonMasqueradeCIDRs); n > c.CidrLimit {
		return Config{}, fmt.Errorf("nonMasqueradeCIDRs: %d CIDRs exceed cidrLimit %d (raise cidrLimit if this is intended)", n, c.CidrLimit)
	}
	return c, nil
}

// ParseAlignedCIDR parses a CIDR whose address is its network address, as ip-masq-agent
// requires: "10.0.0.1/8" is almost always a typo for a host or a different network.
func ParseAlignedCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q: a CIDR has no zone", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q is not network-aligned (the network is %s)", s, p.Masked())
	}
	return p, nil
}

// LoadConfig reads the config file at path. A missing file means the defaults, as in
// ip-masq-agent, so a DaemonSet can run with an optional ConfigMap.
func LoadConfig(path string, allReservedRanges bool) (Config, bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return DefaultConfig(allReservedRanges), false, nil
	}
	if err != nil {
		return Config{}, false, fmt.Errorf("masquerade config %s: %w", path, err)
	}
	c, err := ParseConfig(data, allReservedRanges)
	if err != nil {
		return Config{}, true, fmt.Errorf("masquerade config %s: %w", path, err)
	}
	return c, true, nil
}
