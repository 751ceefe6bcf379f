package cli

import (
	"strings"
	"testing"
)

func TestDropFlags(t *testing.T) {
	for _, tc := range []struct {
		f       dropFlags
		np      bool
		wantErr string
	}{
		{f: dropFlags{rate: 0}, np: true},
		{f: dropFlags{enabled: true, rate: 10, burst: 20, group: 5}, np: true},
		{f: dropFlags{enabled: true, rate: 0, burst: 20}, np: true, wantErr: "--log-drops-rate 0: want 1 to 10000"},
		{f: dropFlags{enabled: true, rate: 10001, burst: 20}, np: true, wantErr: "--log-drops-rate 10001"},
		{f: dropFlags{enabled: true, rate: 10, burst: 0}, np: true, wantErr: "--log-drops-burst 0"},
		{f: dropFlags{enabled: true, rate: 10, burst: 20}, np: false, wantErr: "needs NetworkPolicy enforcement"},
	} {
		cfg, err := tc.f.config(tc.np)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%+v: %v", tc.f, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v: error %v, want one containing %q", tc.f, err, tc.wantErr)
		case tc.wantErr == "" && (cfg != nil) != tc.f.enabled:
			t.Errorf("%+v: config %+v", tc.f, cfg)
		case cfg != nil && (cfg.Rate != tc.f.rate || cfg.Burst != tc.f.burst || cfg.Group != tc.f.group):
			t.Errorf("%+v: config %+v", tc.f, cfg)
		}
	}
}
