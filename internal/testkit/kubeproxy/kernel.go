package kubeproxy

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
)

// run runs a command inside the node netns and returns its standard output (iptables-nft-save
// warns on stderr, in the middle of a line if both went to one pipe), or its error output with
// the error.
func (p *Proxy) run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := p.opts.Node.InNetNSGo(func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	})
	if err != nil {
		return stderr.String(), fmt.Errorf("%s %v in %s: %w: %s", name, args, p.opts.Node, err, stderr.String())
	}
	return stdout.String(), nil
}

var (
	// In the service-ips map: "10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80".
	nftServiceElem = regexp.MustCompile(`([0-9a-fA-F:.]+) \. (tcp|udp|sctp) \. (\d+) : goto (\S+?)(?:[,\s}]|$)`)
	// In the service-nodeports map: "tcp . 30080 : goto external-...".
	nftNodePortElem = regexp.MustCompile(`(tcp|udp|sctp) \. (\d+) : goto `)
	nftDNATOne      = regexp.MustCompile(`dnat to (\S+)`)
	nftDNATMapElem  = regexp.MustCompile(`\d+ : ([0-9a-fA-F:.]+) \. (\d+)`)
	// An endpoint chain's name: "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80", an IPv6
	// address with its colons written as dots.
	nftEndpointChain = regexp.MustCompile(`endpoint-[A-Z0-9]+-\S+?__([0-9a-fA-F.]+)/(\d+)`)
)

// nftView reads kube-proxy's tables (ip and ip6 kube-proxy) in the node netns.
func (p *Proxy) nftView(ctx context.Context) (kernelView, error) {
	k := kernelView{services: map[string][]string{}, nodePorts: map[string]bool{}, detail: map[string]string{}}
	for _, fam := range []string{"ip", "ip6"} {
		out, err := p.run(ctx, "nft", "list", "table", fam, "kube-proxy")
		if err != nil {
			if strings.Contains(out, "No such file") {
				continue // this family has no table (yet)
			}
			return k, err
		}
		blocks := nftBlocks(out)
		for _, m := range nftServiceElem.FindAllStringSubmatch(blocks["map service-ips"], -1) {
			addr, err := netip.ParseAddr(m[1])
			if err != nil {
				continue
			}
			key := addr.String() + " " + m[2] + "/" + m[3]
			var eps []string
			add := func(ap netip.AddrPort) {
				if s := ap.String(); !slicesContains(eps, s) {
					eps = append(eps, s)
				}
			}
			chain := blocks["chain "+m[4]]
			// One endpoint: "dnat to 10.244.0.2:80" ("[fd00::2]:80").
			for _, e := range nftDNATOne.FindAllStringSubmatch(chain, -1) {
				if ap, err := netip.ParseAddrPort(e[1]); err == nil {
					add(ap)
				}
			}
			// Several: "dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.0.2 . 80, 1 : ... }".
			for _, e := range nftDNATMapElem.FindAllStringSubmatch(chain, -1) {
				if ip, err := netip.ParseAddr(e[1]); err == nil {
					add(netip.AddrPortFrom(ip, parsePort(e[2])))
				}
			}
			// With session affinity: a chain per endpoint, its address in the name.
			for _, e := range nftEndpointChain.FindAllStringSubmatch(chain, -1) {
				ipText := e[1]
				if fam == "ip6" {
					ipText = strings.ReplaceAll(ipText, ".", ":")
				}
				ip, err := netip.ParseAddr(ipText)
				if err != nil {
					continue
				}
				add(netip.AddrPortFrom(ip, parsePort(e[2])))
			}
			k.services[key] = eps
			k.detail[key] = m[4] + ": " + blocks["chain "+m[4]]
		}
		for _, m := range nftNodePortElem.FindAllStringSubmatch(blocks["map service-nodeports"], -1) {
			k.nodePorts[m[1]+"/"+m[2]] = true
		}
	}
	return k, nil
}

// nftBlocks splits an `nft list table` listing into its sets, maps and chains, keyed by
// "chain NAME", "map NAME" or "set NAME", each with its whole text on one line.
func nftBlocks(listing string) map[string]string {
	out := map[string]string{}
	var name string
	var body []string
	for _, l := range strings.Split(listing, "\n") {
		t := strings.TrimSpace(l)
		if name == "" {
			for _, kind := range []string{"chain ", "map ", "set "} {
				if strings.HasPrefix(t, kind) && strings.HasSuffix(t, "{") {
					name = strings.TrimSpace(strings.TrimSuffix(t, "{"))
					body = nil
				}
			}
			continue
		}
		// Blocks are closed by a "}" at their own indentation (one tab in a table).
		if l == "\t}" {
			out[name] = strings.Join(body, " ")
			name = ""
			continue
		}
		body = append(body, t)
	}
	return out
}

var (
	// "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "ns/svc:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XXXX"
	iptServiceRule = regexp.MustCompile(`^-A KUBE-SERVICES -d ([0-9a-fA-F:.]+)/\d+ -p (tcp|udp|sctp) .*--dport (\d+) -j (KUBE-SVC-\w+)`)
	// "-A KUBE-SVC-XXXX -m comment --comment "ns/svc:p80 -> 10.244.0.2:80" ... -j KUBE-SEP-YYYY"
	iptEndpointRule = regexp.MustCompile(`^-A (KUBE-SVC-\w+) .*--comment "?[^"]* -> ([^" ]+)"? .*-j KUBE-SEP-`)
	// "-A KUBE-NODEPORTS -p tcp -m comment --comment "ns/svc:p80" -m tcp --dport 30080 -j KUBE-EXT-XXXX"
	iptNodePortRule = regexp.MustCompile(`^-A KUBE-NODEPORTS -p (tcp|udp|sctp) .*--dport (\d+) -j `)
)

// iptablesView reads kube-proxy's chains in the nat tables of the variant it runs with.
func (p *Proxy) iptablesView(ctx context.Context) (kernelView, error) {
	k := kernelView{services: map[string][]string{}, nodePorts: map[string]bool{}, detail: map[string]string{}}
	for _, fam := range []string{"iptables", "ip6tables"} {
		out, err := p.run(ctx, fam+"-"+p.opts.IPTablesVariant+"-save", "-t", "nat")
		if err != nil {
			return k, err
		}
		svcChains := map[string]string{} // KUBE-SVC chain -> service key
		eps := map[string][]string{}     // KUBE-SVC chain -> endpoints
		for _, l := range strings.Split(out, "\n") {
			if m := iptServiceRule.FindStringSubmatch(l); m != nil {
				if addr, err := netip.ParseAddr(m[1]); err == nil {
					svcChains[m[4]] = addr.String() + " " + m[2] + "/" + m[3]
				}
			}
			if m := iptEndpointRule.FindStringSubmatch(l); m != nil {
				if ap, err := netip.ParseAddrPort(m[2]); err == nil && !slicesContains(eps[m[1]], ap.String()) {
					eps[m[1]] = append(eps[m[1]], ap.String())
				}
			}
			if m := iptNodePortRule.FindStringSubmatch(l); m != nil {
				k.nodePorts[m[1]+"/"+m[2]] = true
			}
		}
		for chain, key := range svcChains {
			k.services[key] = eps[chain]
		}
	}
	return k, nil
}

func parsePort(s string) uint16 {
	var n uint16
	fmt.Sscanf(s, "%d", &n)
	return n
}
