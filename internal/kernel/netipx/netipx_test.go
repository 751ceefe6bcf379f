package netipx

import (
	"net/netip"
	"testing"
)

func TestLastAddr(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.0/8":        "10.255.255.255",
		"10.1.2.3/32":       "10.1.2.3",
		"192.0.2.77/25":     "192.0.2.127",
		"0.0.0.0/0":         "255.255.255.255",
		"2001:db8::/32":     "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
		"fd00::1/128":       "fd00::1",
		"2001:db8:0:1::/63": "2001:db8:0:1:ffff:ffff:ffff:ffff",
	} {
		if got := LastAddr(netip.MustParsePrefix(in)); got.String() != want {
			t.Errorf("LastAddr(%s) = %s, want %s", in, got, want)
		}
	}
}
