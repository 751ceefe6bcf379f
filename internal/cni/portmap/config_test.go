package portmap

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func conf(t *testing.T, extra map[string]any, mappings ...map[string]any) []byte {
	t.Helper()
	c := map[string]any{"cniVersion": "1.1.0", "name": "n", "type": "netwarden-portmap",
		"runtimeConfig": map[string]any{"portMappings": mappings}}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseErrorsNameTheField(t *testing.T) {
	ok := map[string]any{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
	cases := []struct {
		name  string
		kind  string
		extra map[string]any
		m     map[string]any
		field string
	}{
		{"host port zero", "nftables", nil, map[string]any{"hostPort": 0, "containerPort": 80}, "runtimeConfig.portMappings[1].hostPort"},
		{"host port too big", "nftables", nil, map[string]any{"hostPort": 70000, "containerPort": 80}, "runtimeConfig.portMappings[1].hostPort"},
		{"container port missing", "nftables", nil, map[string]any{"hostPort": 80}, "runtimeConfig.portMappings[1].containerPort"},
		{"bad protocol", "nftables", nil, map[string]any{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}, "runtimeConfig.portMappings[1].protocol"},
		{"bad host IP", "nftables", nil, map[string]any{"hostPort": 80, "containerPort": 80, "hostIP": "300.1.1.1"}, "runtimeConfig.portMappings[1].hostIP"},
		{"v6 localhost", "nftables", map[string]any{"localhostHostPorts": true}, map[string]any{"hostPort": 80, "containerPort": 80, "hostIP": "::1"}, "runtimeConfig.portMappings[1].hostIP"},
		{"v4 localhost without opt-in", "nftables", nil, map[string]any{"hostPort": 80, "containerPort": 80, "hostIP": "127.0.0.1"}, "runtimeConfig.portMappings[1].hostIP"},
		{"iptables conditions on nftables", "nftables", map[string]any{"conditionsV4": []string{"!", "-d", "192.0.2.0/24"}}, ok, "conditionsV4[0]"},
		{"nft conditions on iptables", "iptables", map[string]any{"conditionsV6": []string{"ip6 daddr != 2001:db8::/32"}}, ok, "conditionsV6[0]"},
		{"verdict in condition", "nftables", map[string]any{"conditionsV4": []string{"drop"}}, ok, "conditionsV4[0]"},
		{"masqAll without snat", "nftables", map[string]any{"masqAll": true, "snat": false}, ok, "masqAll"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(conf(t, c.extra, ok, c.m), c.kind)
			te, isCNI := err.(*types.Error)
			if !isCNI {
				t.Fatalf("want a CNI error naming %s, got %v", c.field, err)
			}
			if te.Code != types.ErrInvalidNetworkConfig || !strings.HasPrefix(te.Msg, c.field+":") {
				t.Fatalf("want code %d naming %s, got code %d %q", types.ErrInvalidNetworkConfig, c.field, te.Code, te.Msg)
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	cfg, err := Parse(conf(t, map[string]any{"conditionsV4": []string{"ip saddr != 192.0.2.0/24"}, "localhostHostPorts": true},
		map[string]any{"hostPort": 53, "containerPort": 5353, "protocol": "UDP", "hostIP": "127.0.0.1"},
		map[string]any{"hostPort": 80, "containerPort": 80, "hostIP": "::"}), "nftables")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.SNAT || len(cfg.Mappings) != 2 || cfg.Mappings[0].Protocol != "udp" || cfg.Mappings[1].HostIP.IsValid() || cfg.Mappings[1].Protocol != "tcp" {
		t.Fatalf("unexpected config %+v", cfg)
	}
}
