package backendchoice

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestCandidates(t *testing.T) {
	for _, tc := range []struct {
		requested, env string
		want           []Kind
		err            string
	}{
		{"auto", "", All, ""},
		{"", "", All, ""},
		{"auto", "legacy", []Kind{NFTables, IPTablesLegacy}, ""},
		{"iptables", "", []Kind{IPTablesNFT, IPTablesLegacy}, ""},
		{"iptables", "nft", []Kind{IPTablesNFT}, ""},
		{"iptables", "iptables-legacy", []Kind{IPTablesLegacy}, ""},
		{"nftables", "legacy", []Kind{NFTables}, ""},
		{"iptables-legacy", "nft", []Kind{IPTablesLegacy}, ""},
		{"iptables", "ebtables", nil, "$NETWARDEN_IPTABLES_MODE"},
		{"ipvs", "", nil, "want auto, nftables or iptables"},
	} {
		t.Setenv(ModeEnv, tc.env)
		got, err := Candidates(tc.requested)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q with %s=%q: error %v, want one naming %s", tc.requested, ModeEnv, tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q with %s=%q: %v, %v; want %v", tc.requested, ModeEnv, tc.env, got, err, tc.want)
		}
	}
}

func TestOpenTakesTheFirstThatWorks(t *testing.T) {
	t.Setenv(ModeEnv, "")
	var tried []Kind
	open := func(_ context.Context, k Kind) (string, error) {
		tried = append(tried, k)
		if k == IPTablesLegacy {
			return "legacy backend", nil
		}
		return "", errors.New("not here")
	}
	v, k, err := Open(context.Background(), "auto", open)
	if err != nil || k != IPTablesLegacy || v != "legacy backend" || !slices.Equal(tried, All) {
		t.Fatalf("got %q %q %v after trying %v", v, k, err, tried)
	}
	_, _, err = Open(context.Background(), "nftables", open)
	if err == nil || !strings.Contains(err.Error(), "nftables unusable: not here") {
		t.Fatalf("error %v does not name the failure", err)
	}
}
