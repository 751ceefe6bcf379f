package domains

import (
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// answer is what one DNS response says about addresses: the name asked, the names its CNAME
// chain leads through, and the addresses at the end of the chain with their TTLs (at most
// maxTTL).
type answer struct {
	question string
	// names are the question and each CNAME target reached from it, in order.
	names []string
	addrs []answerAddr
}

type answerAddr struct {
	addr netip.Addr
	ttl  time.Duration
}

// parseAnswer reads a DNS response. Only a successful answer to one A or AAAA question yields
// addresses, and only records on the CNAME chain from the question: a record for any other
// name in the message (additional data, a server's glue) admits nothing.
func parseAnswer(msg []byte) (answer, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return answer{}, fmt.Errorf("dns header: %w", err)
	}
	if !h.Response {
		return answer{}, fmt.Errorf("not a response")
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return answer{}, fmt.Errorf("dns question: %w", err)
	}
	if len(qs) != 1 {
		return answer{}, fmt.Errorf("%d questions", len(qs))
	}
	q := qs[0]
	a := answer{question: canonical(q.Name.String())}
	if h.RCode != dnsmessage.RCodeSuccess || (q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeAAAA) || q.Class != dnsmessage.ClassINET {
		return a, nil
	}
	type rec struct {
		name   string
		cname  string
		addr   netip.Addr
		ttl    time.Duration
		isAddr bool
	}
	var recs []rec
	for {
		rh, err := p.AnswerHeader()
		if err == dnsmessage.ErrSectionDone {
			break
		}
		if err != nil {
			return a, fmt.Errorf("dns answer: %w", err)
		}
		r := rec{name: canonical(rh.Name.String()), ttl: answerTTL(rh.TTL)}
		switch rh.Type {
		case dnsmessage.TypeA:
			b, err := p.AResource()
			if err != nil {
				return a, err
			}
			r.addr, r.isAddr = netip.AddrFrom4(b.A), true
		case dnsmessage.TypeAAAA:
			b, err := p.AAAAResource()
			if err != nil {
				return a, err
			}
			r.addr, r.isAddr = netip.AddrFrom16(b.AAAA), true
		case dnsmessage.TypeCNAME:
			b, err := p.CNAMEResource()
			if err != nil {
				return a, err
			}
			r.cname = canonical(b.CNAME.String())
		default:
			if err := p.SkipAnswer(); err != nil {
				return a, err
			}
			continue
		}
		if rh.Class == dnsmessage.ClassINET {
			recs = append(recs, r)
		}
	}
	// Follow the chain from the question, whatever the order of the records; a loop ends it.
	a.names = []string{a.question}
	onChain := map[string]bool{a.question: true}
	for cur := a.question; ; {
		next := ""
		for _, r := range recs {
			if r.name == cur && r.cname != "" && !onChain[r.cname] {
				next = r.cname
				break
			}
		}
		if next == "" {
			break
		}
		onChain[next] = true
		a.names = append(a.names, next)
		cur = next
	}
	// Only the chain's end has addresses: a name with a CNAME has no other records, so an
	// address for a name midway is no part of the answer (it could smuggle one in).
	end := a.names[len(a.names)-1]
	for _, r := range recs {
		if r.isAddr && r.name == end {
			a.addrs = append(a.addrs, answerAddr{addr: r.addr.Unmap(), ttl: r.ttl})
		}
	}
	return a, nil
}

// maxTTL bounds how long one answer admits an address: a day, well within both backends'
// timeouts (ipset's is at most 2^31 ms on some versions).
const maxTTL = 24 * time.Hour

// answerTTL reads a record's TTL as RFC 2181 says: one with the top bit set is zero.
func answerTTL(ttl uint32) time.Duration {
	if ttl&(1<<31) != 0 {
		return 0
	}
	return min(time.Duration(ttl)*time.Second, maxTTL)
}
