package domains_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkDomainNames measures, from the client pod, a DNS lookup's round trip through the
// node: with no domainNames policy (no reply is queued), with one for names it does not match
// (each reply held and read, nothing written), and for names it matches, each answer a new
// address (held until the address is in the kernel: the answer → kernel latency, as the pod
// sees it). The agent's own hold time is its histogram netwarden_domain_answer_hold_seconds.
func BenchmarkDomainNames(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) { benchmarkDomainNames(b, be) })
	}
}

func benchmarkDomainNames(b *testing.B, be backend) {
	const lookups = 2000
	s := newScene(b, be)
	r := s.resolver()
	rtts := func(name func(i int) string, qtype uint16) []time.Duration {
		out := make([]time.Duration, 0, lookups)
		err := s.inClient(func() error {
			for i := 1; i <= lookups; i++ {
				began := time.Now()
				if _, err := r.lookup(name(i), qtype, "udp", false); err != nil {
					return err
				}
				out = append(out, time.Since(began))
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		slices.Sort(out)
		return out
	}
	q := func(d []time.Duration, p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Microseconds())
	}
	report := func(what string, d []time.Duration) {
		b.ReportMetric(q(d, 0.5), what+"-p50-µs")
		b.ReportMetric(q(d, 0.99), what+"-p99-µs")
		b.Logf("%s: p50 %v p99 %v max %v (%d lookups)", what, d[len(d)/2], d[len(d)*99/100], d[len(d)-1], len(d))
	}
	for range b.N {
		learned := rtts(func(i int) string { return fmt.Sprintf("n%d.example.test", i) }, dns.TypeAAAA)
		unmatched := rtts(func(int) string { return "evil.test" }, dns.TypeA)
		// Without the domainNames policy no reply is queued.
		s.setPolicies(policies(s.sim.Bed.NodeIP(4))[:1])
		if err := s.sim.WaitApplied(30 * time.Second); err != nil {
			b.Fatal(err)
		}
		plain := rtts(func(int) string { return "evil.test" }, dns.TypeA)
		report("dns-without-feature", plain)
		report("dns-unmatched-name", unmatched)
		report("dns-learned-new-address", learned)
		b.ReportMetric(q(learned, 0.5)-q(plain, 0.5), "answer-to-kernel-p50-µs")
		b.ReportMetric(q(learned, 0.99)-q(plain, 0.99), "answer-to-kernel-p99-µs")
	}
}
