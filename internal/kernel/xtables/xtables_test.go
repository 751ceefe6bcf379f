package xtables

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestHashNetPrefixes(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0/0":    "[0.0.0.0/1 128.0.0.0/1]",
		"::/0":         "[::/1 8000::/1]",
		"10.0.0.0/8":   "[10.0.0.0/8]",
		"10.1.2.3/8":   "[10.0.0.0/8]",
		"128.0.0.0/1":  "[128.0.0.0/1]",
		"fd00::1/128":  "[fd00::1/128]",
		"192.0.2.7/32": "[192.0.2.7/32]",
		"255.0.0.0/0":  "[0.0.0.0/1 128.0.0.0/1]",
		"ffff::1/0":    "[::/1 8000::/1]",
		"0.0.0.0/1":    "[0.0.0.0/1]",
	} {
		if got := fmt.Sprint(HashNetPrefixes(netip.MustParsePrefix(in))); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
