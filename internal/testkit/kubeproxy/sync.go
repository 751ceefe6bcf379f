package kubeproxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Metrics reads kube-proxy's /metrics and returns every sample whose metric name starts with
// "kubeproxy_", keyed by the sample as printed ("name{labels}").
func (p *Proxy) Metrics(ctx context.Context) (map[string]float64, error) {
	body, status, err := p.get(ctx, MetricsAddr, "/metrics")
	if err != nil {
		return nil, err
	}
	if status != 200 {
		return nil, fmt.Errorf("/metrics: status %d", status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "kubeproxy_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// samples returns the values of the samples of metric name (any labels).
func samples(m map[string]float64, name string) []float64 {
	var out []float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			out = append(out, v)
		}
	}
	return out
}

// WaitSynced waits until kube-proxy reports, for every IP family it proxies, a successful sync
// of its rules that ended at or after since, and no Service or EndpointSlice change pending.
// It answers "has kube-proxy synced since then", not "has it seen a given write": for that,
// use WaitProgrammed.
func (p *Proxy) WaitSynced(timeout time.Duration, since time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	want := float64(since.UnixNano()) / 1e9
	var last string
	for {
		if err := p.exited(); err != nil {
			return fmt.Errorf("waiting for kube-proxy to sync: %v\n%s", err, tail(p.Logs(), 30))
		}
		m, err := p.Metrics(ctx)
		if err == nil {
			ts := samples(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
			pending := slices.Concat(samples(m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
				samples(m, "kubeproxy_sync_proxy_rules_service_changes_pending"))
			ok := len(ts) > 0 && !slices.ContainsFunc(ts, func(v float64) bool { return v < want-1e-3 }) &&
				!slices.ContainsFunc(pending, func(v float64) bool { return v != 0 })
			if ok {
				return nil
			}
			last = fmt.Sprintf("last sync timestamps %v (want >= %.3f), pending changes %v", ts, want, pending)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-proxy did not sync within %v: %s\n%s", timeout, last, tail(p.Logs(), 30))
		case <-time.After(50 * time.Millisecond): // a poll interval, not a guess at sync time
		}
	}
}

// ServicePort is one (address, protocol, port) kube-proxy programs and the endpoints
// ("ip:port", IPv6 bracketed) it sends that traffic to. A NodePort entry has an invalid Addr.
type ServicePort struct {
	Service   string // namespace/name
	Addr      netip.Addr
	Protocol  corev1.Protocol
	Port      int32
	Endpoints []string
}

func (sp ServicePort) String() string {
	addr := "nodeport"
	if sp.Addr.IsValid() {
		addr = sp.Addr.String()
	}
	return fmt.Sprintf("%s %s %s/%d -> %v", sp.Service, addr, sp.Protocol, sp.Port, sp.Endpoints)
}

// Expected lists what kube-proxy programs for the Services and EndpointSlices client reads
// now: per cluster IP and port the ready endpoints of its family, and per NodePort (of a
// Service with any ready endpoint) an entry without endpoints.
func Expected(ctx context.Context, client kubernetes.Interface) ([]ServicePort, error) {
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	epSlices, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []ServicePort
	for _, svc := range svcs.Items {
		if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		if _, ok := svc.Labels["service.kubernetes.io/service-proxy-name"]; ok {
			continue
		}
		name := svc.Namespace + "/" + svc.Name
		for _, port := range svc.Spec.Ports {
			anyReady := false
			for _, ipStr := range svc.Spec.ClusterIPs {
				ip, err := netip.ParseAddr(ipStr)
				if err != nil {
					return nil, fmt.Errorf("service %s: cluster IP %q: %w", name, ipStr, err)
				}
				sp := ServicePort{Service: name, Addr: ip, Protocol: port.Protocol, Port: port.Port}
				for _, es := range epSlices.Items {
					if es.Namespace != svc.Namespace || es.Labels[discoveryv1.LabelServiceName] != svc.Name {
						continue
					}
					if (es.AddressType == discoveryv1.AddressTypeIPv4) != ip.Is4() {
						continue
					}
					var epPort int32 = -1
					for _, ep := range es.Ports {
						if ptrOr(ep.Name, "") == port.Name && ptrOr(ep.Protocol, corev1.ProtocolTCP) == port.Protocol && ep.Port != nil {
							epPort = *ep.Port
						}
					}
					if epPort < 0 {
						continue
					}
					for _, ep := range es.Endpoints {
						if !ptrOr(ep.Conditions.Ready, true) {
							continue
						}
						for _, a := range ep.Addresses {
							addr, err := netip.ParseAddr(a)
							if err != nil {
								continue
							}
							s := netip.AddrPortFrom(addr, uint16(epPort)).String()
							if !slicesContains(sp.Endpoints, s) {
								sp.Endpoints = append(sp.Endpoints, s)
							}
						}
					}
				}
				sort.Strings(sp.Endpoints)
				anyReady = anyReady || len(sp.Endpoints) > 0
				out = append(out, sp)
			}
			if port.NodePort != 0 && anyReady {
				out = append(out, ServicePort{Service: name, Protocol: port.Protocol, Port: port.NodePort})
			}
		}
	}
	return out, nil
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func slicesContains(s []string, v string) bool { return slices.Contains(s, v) }

// WaitProgrammed waits until the kernel of the node netns holds, for every Service and
// EndpointSlice client reads, the rules kube-proxy makes of them: each cluster IP and port
// leads to exactly its ready endpoints (or, without any, to none), and each NodePort is there.
// It reads the kernel, not kube-proxy's word. The API is read again at every poll: other tests
// sharing the API server change their Services meanwhile, and kube-proxy follows them past
// any one earlier reading; what the caller wrote before the call is in every later one.
func (p *Proxy) WaitProgrammed(timeout time.Duration, client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var missing []string
	var lastErr error
	for {
		want, err := Expected(ctx, client)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("kubeproxy: reading Services and EndpointSlices: %w", err)
		}
		if err := p.exited(); err != nil {
			return fmt.Errorf("waiting for kube-proxy to program the Services: %v\n%s", err, tail(p.Logs(), 30))
		}
		m, err := p.missing(ctx, want)
		if err == nil && len(m) == 0 {
			return nil
		}
		if err != nil {
			if ctx.Err() == nil {
				lastErr = err
			}
		} else {
			missing = m
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-proxy (%s mode) did not program within %v (last error reading the kernel: %v):\n  %s\nkube-proxy log:\n%s",
				p.opts.Mode, timeout, lastErr, strings.Join(missing, "\n  "), tail(p.Logs(), 30))
		case <-time.After(50 * time.Millisecond): // a poll interval, not a guess at sync time
		}
	}
}

// missing returns what of want the kernel does not hold (yet).
func (p *Proxy) missing(ctx context.Context, want []ServicePort) ([]string, error) {
	var k kernelView
	var err error
	switch p.opts.Mode {
	case NFTables:
		k, err = p.nftView(ctx)
	case IPTables:
		k, err = p.iptablesView(ctx)
	default:
		return nil, fmt.Errorf("WaitProgrammed does not read the kernel of the %s mode", p.opts.Mode)
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, sp := range want {
		if !sp.Addr.IsValid() {
			if !k.nodePorts[protoPort(sp.Protocol, sp.Port)] {
				out = append(out, "no NodePort rule: "+sp.String())
			}
			continue
		}
		got, ok := k.services[svcKey(sp.Addr, sp.Protocol, sp.Port)]
		sort.Strings(got)
		switch {
		case len(sp.Endpoints) == 0 && ok && len(got) > 0:
			out = append(out, fmt.Sprintf("endpoints %v still programmed: %s", got, sp))
		case len(sp.Endpoints) > 0 && !slices.Equal(got, sp.Endpoints):
			out = append(out, fmt.Sprintf("kernel has endpoints %v: %s (%s)", got, sp, k.detail[svcKey(sp.Addr, sp.Protocol, sp.Port)]))
		}
	}
	return out, nil
}

// kernelView is what kube-proxy's rules in the kernel say: the endpoints of each
// "address proto port", and which "proto port" NodePorts exist.
type kernelView struct {
	services  map[string][]string
	nodePorts map[string]bool
	detail    map[string]string // what the endpoints were read from, for failure messages
}

func svcKey(addr netip.Addr, proto corev1.Protocol, port int32) string {
	return addr.String() + " " + protoPort(proto, port)
}

func protoPort(proto corev1.Protocol, port int32) string {
	return strings.ToLower(string(proto)) + "/" + strconv.Itoa(int(port))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
