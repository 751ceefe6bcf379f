package masquerade

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseConfigDefaults(t *testing.T) {
	for _, in := range []string{"", "{}", "null\n"} {
		c, err := ParseConfig([]byte(in), false)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := prefixStrings(c.NonMasqueradeCIDRs); got != "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16" {
			t.Errorf("%q: default CIDRs %s", in, got)
		}
		if c.CidrLimit != 64 || c.ResyncInterval != time.Minute || c.MasqLinkLocal || c.MasqLinkLocalIPv6 {
			t.Errorf("%q: defaults %+v", in, c)
		}
	}
	c, err := ParseConfig([]byte("masqLinkLocal: true\n"), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.NonMasqueradeCIDRs) != 11 || !c.MasqLinkLocal {
		t.Errorf("reserved ranges default plus one field: %+v", c)
	}
	// A list given in the file replaces the default list, also with the reserved-ranges flag.
	c, err = ParseConfig([]byte(`{"nonMasqueradeCIDRs": ["198.51.100.0/24", "2001:db8::/32"], "resyncInterval": "5s", "cidrLimit": 2}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if got := prefixStrings(c.NonMasqueradeCIDRs); got != "198.51.100.0/24,2001:db8::/32" || c.ResyncInterval != 5*time.Second {
		t.Errorf("explicit config: %s %v", got, c.ResyncInterval)
	}
	c, err = ParseConfig([]byte("nonMasqueradeCIDRs: []\n"), false)
	if err != nil || len(c.NonMasqueradeCIDRs) != 0 {
		t.Errorf("empty list: %v %v", c.NonMasqueradeCIDRs, err)
	}
}

func TestParseConfigErrorsNameFieldAndValue(t *testing.T) {
	for in, want := range map[string]string{
		"nonMasqueradeCIDRs: [10.0.0.0/8, 10.1.2.3/16]": `nonMasqueradeCIDRs[1]: "10.1.2.3/16" is not network-aligned (the network is 10.1.0.0/16)`,
		"nonMasqueradeCIDRs: [banana]":                  `nonMasqueradeCIDRs[0]: "banana" is not a CIDR`,
		"nonMasqueradeCIDRs: 10.0.0.0/8":                "field nonMasqueradeCIDRs",
		"resyncInterval: 60":                            "field resyncInterval",
		"resyncInterval: soon":                          `resyncInterval: "soon" is not a duration`,
		"resyncInterval: -1s":                           `resyncInterval: "-1s" must be positive`,
		"cidrLimit: -3":                                 "cidrLimit: -3 is negative",
		"cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]": "nonMasqueradeCIDRs: 2 CIDRs exceed cidrLimit 1",
		"masqLinkLocal: maybe":            "field masqLinkLocal",
		"nonMasqCIDRs: [10.0.0.0/8]":      `unknown field "nonMasqCIDRs"`,
		"nonMasqueradeCIDRs: [10.0.0.0/8": "not valid YAML or JSON",
	} {
		_, err := ParseConfig([]byte(in), false)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
}

func TestConfigFileKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config")
	cf := NewConfigFile(path, false, nil)
	if changed, err := cf.Reload(); err != nil || !changed {
		t.Fatalf("missing file: changed=%v err=%v", changed, err)
	}
	if c, ok, _ := cf.Current(); !ok || len(c.NonMasqueradeCIDRs) != 3 {
		t.Fatalf("missing file gives defaults: %+v", c)
	}
	os.WriteFile(path, []byte("nonMasqueradeCIDRs: [198.51.100.0/24]\n"), 0o644)
	if changed, err := cf.Reload(); err != nil || !changed {
		t.Fatalf("valid file: changed=%v err=%v", changed, err)
	}
	os.WriteFile(path, []byte("nonMasqueradeCIDRs: [198.51.100.1/24]\n"), 0o644)
	changed, err := cf.Reload()
	if err == nil || changed || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "nonMasqueradeCIDRs[0]") {
		t.Fatalf("invalid file: changed=%v err=%v", changed, err)
	}
	c, ok, lastErr := cf.Current()
	if !ok || lastErr == nil || prefixStrings(c.NonMasqueradeCIDRs) != "198.51.100.0/24" {
		t.Fatalf("after an invalid file the last good config stays: %+v %v", c, lastErr)
	}
	if changed, _ := cf.Reload(); changed {
		t.Fatal("an unchanged invalid file is not a change")
	}
}

func TestComputeMergesAndFollowsNodes(t *testing.T) {
	cfg := Config{NonMasqueradeCIDRs: mustPrefixes("10.0.0.0/9", "10.128.0.0/9", "198.51.100.0/24", "fd00:1::/64")}
	nodes := map[string]*corev1.Node{
		"n1": node("n1", "10.244.1.0/24", "fd00:10:244:1::/64"),
		"n2": node("n2", "172.31.2.0/24", "fd00:10:244:2::/64"),
	}
	d := Compute(cfg, Options{RandomFully: true}, nodes, "n1")
	// Overlapping and contained CIDRs merge (10.244.1.0/24 is inside 10.0.0.0/9); adjacent
	// ones stay apart, so that adding one never deletes an element.
	if got := rangeStrings(d.NoMasquerade[0]); got != "10.0.0.0/9,10.128.0.0/9,169.254.0.0/16,172.31.2.0/24,198.51.100.0/24" {
		t.Errorf("IPv4 non-masquerade: %s", got)
	}
	if got := rangeStrings(d.NoMasquerade[1]); got != "fd00:1::/64,fd00:10:244:1::/64,fd00:10:244:2::/64,fe80::/10" {
		t.Errorf("IPv6 non-masquerade: %s", got)
	}
	overlapping := Compute(Config{NonMasqueradeCIDRs: mustPrefixes("10.0.0.0/16", "10.0.128.0/17", "10.0.255.0/24", "10.1.0.0/16")}, Options{}, nil, "n1")
	if got := rangeStrings(overlapping.NoMasquerade[0]); got != "10.0.0.0/16,10.1.0.0/16,169.254.0.0/16" {
		t.Errorf("contained CIDRs: %s", got)
	}
	if got := rangeStrings(canonical(d.NoMasquerade[0], false)); got != "10.0.0.0/8,169.254.0.0/16,172.31.2.0/24,198.51.100.0/24" {
		t.Errorf("canonical form: %s", got)
	}
	if got := rangeStrings(d.Sources[0]) + " " + rangeStrings(d.Sources[1]); got != "10.244.1.0/24 fd00:10:244:1::/64" {
		t.Errorf("sources: %s", got)
	}
	// A new Node inside an existing range changes nothing.
	nodes["n3"] = node("n3", "10.244.3.0/24")
	if d2 := Compute(cfg, Options{RandomFully: true}, nodes, "n1"); !d.Equal(d2) {
		t.Error("a Node inside 10.0.0.0/8 changed the desired state")
	}
	all := Compute(Config{MasqLinkLocal: true, MasqLinkLocalIPv6: true}, Options{AllSources: true}, nil, "n1")
	if got := rangeStrings(all.Sources[0]) + " " + rangeStrings(all.Sources[1]); got != "0.0.0.0/0 ::/0" {
		t.Errorf("all sources: %s", got)
	}
	if len(all.NoMasquerade[0])+len(all.NoMasquerade[1]) != 0 {
		t.Errorf("masqLinkLocal on both families leaves no exemption: %v", all.NoMasquerade)
	}
}

func TestRangePrefixes(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.0-10.0.0.255":                        "10.0.0.0/24",
		"10.0.0.1-10.0.0.6":                          "10.0.0.1/32,10.0.0.2/31,10.0.0.4/31,10.0.0.6/32",
		"0.0.0.0-255.255.255.255":                    "0.0.0.0/0",
		"::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": "::/0",
		"128.0.0.0-255.255.255.255":                  "128.0.0.0/1",
		"fd00::-fd00::1:ffff":                        "fd00::/111",
		"11.0.0.0-12.255.255.255":                    "11.0.0.0/8,12.0.0.0/8",
		"192.168.1.7-192.168.1.7":                    "192.168.1.7/32",
	} {
		r, err := parseRange(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := prefixStrings(r.Prefixes()); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
		// Prefixes and merge are inverses.
		if back := mergeRanges(r.Prefixes(), r.First.Is6(), true); len(back) != 1 || back[0] != r {
			t.Errorf("%s: merge of its prefixes gives %v", in, back)
		}
	}
}

func node(name string, cidrs ...string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
}

func mustPrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func prefixStrings(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

func rangeStrings(rs []Range) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.String())
	}
	return strings.Join(s, ",")
}

// TestConfigFileWatchConfigMapUpdate updates the file the way the kubelet updates a mounted
// ConfigMap: the data lives in a timestamped directory, "..data" points to it, and the file is a
// symlink through "..data"; an update swaps "..data" by rename.
func TestConfigFileWatchConfigMapUpdate(t *testing.T) {
	dir := t.TempDir()
	write := func(version, content string) {
		t.Helper()
		ts := filepath.Join(dir, "..v"+version)
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "config"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink("..v"+version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	write("1", "nonMasqueradeCIDRs: [198.51.100.0/24]\n")
	if err := os.Symlink("..data/config", filepath.Join(dir, "config")); err != nil {
		t.Fatal(err)
	}
	cf := NewConfigFile(filepath.Join(dir, "config"), false, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	notified := make(chan struct{}, 10)
	go cf.Watch(ctx, func() { notified <- struct{}{} })
	// Watch loads the file once its watch is set up, and notifies of that first config.
	select {
	case <-notified:
	case <-time.After(5 * time.Second):
		t.Fatal("no first load")
	}
	if st := cf.State(); st.ReadSum == "" || st.Sum != st.ReadSum {
		t.Fatalf("after the first load: %+v", st)
	}
	first := cf.State().Sum
	write("2", "nonMasqueradeCIDRs: [203.0.113.0/24]\n")
	select {
	case <-notified:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload after the ConfigMap update")
	}
	if c, _, err := cf.Current(); err != nil || prefixStrings(c.NonMasqueradeCIDRs) != "203.0.113.0/24" {
		t.Fatalf("after the update: %v %v", prefixStrings(c.NonMasqueradeCIDRs), err)
	}
	if st := cf.State(); st.Sum == first || st.Sum != st.ReadSum {
		t.Errorf("the content hash did not follow the update: %+v (first %s)", st, first)
	}
}
