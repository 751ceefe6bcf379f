package domains

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/netwarden/netwarden/internal/policy"
)

func TestMatches(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "x.api.example.com", false},
		{"api.example.com", "example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "aexample.com", false},
		{"*.example.com", "a.example.com.evil", false},
		{"*.example.com", ".example.com", false},
	} {
		if got := Matches(c.pattern, c.name); got != c.want {
			t.Errorf("Matches(%q, %q) = %v", c.pattern, c.name, got)
		}
	}
}

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func reply(t *testing.T, q string, qtype uint16, rrs ...string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(q, qtype)
	m.Response = true
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	return m
}

func TestParseAnswer(t *testing.T) {
	// A chain out of order, a record off the chain, a loop back to the question.
	m := reply(t, "WWW.Example.com.", dns.TypeA,
		"lb.cdn.net. 30 IN A 192.0.2.1",
		"www.example.com. 300 IN CNAME Edge.example.net.",
		"unrelated.example.org. 300 IN A 192.0.2.9",
		"edge.example.net. 300 IN CNAME lb.cdn.net.",
		"lb.cdn.net. 20 IN CNAME www.example.com.",
		"lb.cdn.net. 30 IN A 192.0.2.2")
	a, err := parseAnswer(pack(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if a.question != "www.example.com" || !slices.Equal(a.names, []string{"www.example.com", "edge.example.net", "lb.cdn.net"}) {
		t.Errorf("question %q names %q", a.question, a.names)
	}
	want := []answerAddr{{netip.MustParseAddr("192.0.2.1"), 30 * time.Second}, {netip.MustParseAddr("192.0.2.2"), 30 * time.Second}}
	if !slices.Equal(a.addrs, want) {
		t.Errorf("addrs %v, want %v", a.addrs, want)
	}

	// An address beside a CNAME, for a name midway on the chain, is no part of the answer:
	// only the chain's end has addresses.
	smuggled := reply(t, "x.attacker.net.", dns.TypeA,
		"x.attacker.net. 60 IN CNAME www.example.com.",
		"x.attacker.net. 60 IN A 192.0.2.66",
		"www.example.com. 60 IN A 192.0.2.7")
	if a, err := parseAnswer(pack(t, smuggled)); err != nil || len(a.addrs) != 1 || a.addrs[0].addr != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("smuggled address: %+v %v", a.addrs, err)
	}
	// TTLs: the top bit set reads as zero; the rest is capped.
	if answerTTL(1<<31|5) != 0 || answerTTL(7*24*3600) != maxTTL || answerTTL(30) != 30*time.Second {
		t.Errorf("TTLs: %v %v %v", answerTTL(1<<31|5), answerTTL(7*24*3600), answerTTL(30))
	}
	if got := printable("a\"b\n.example.com"); got != "a?b?.example.com" {
		t.Errorf("printable: %q", got)
	}

	// Not a response, an error, another question type: no addresses.
	q := reply(t, "a.example.com.", dns.TypeA, "a.example.com. 30 IN A 192.0.2.1")
	q.Response = false
	if _, err := parseAnswer(pack(t, q)); err == nil {
		t.Error("a query parsed as an answer")
	}
	nx := reply(t, "a.example.com.", dns.TypeA, "a.example.com. 30 IN A 192.0.2.1")
	nx.Rcode = dns.RcodeNameError
	if a, err := parseAnswer(pack(t, nx)); err != nil || len(a.addrs) != 0 {
		t.Errorf("NXDOMAIN: %v %v", a.addrs, err)
	}
	if _, err := parseAnswer([]byte{1, 2, 3}); err == nil {
		t.Error("garbage parsed")
	}
}

// tcpSegment builds the TCP payload of a server's reply segment as parseSegment returns it.
func seg(seq uint32, syn bool, payload []byte) segment {
	return segment{src: netip.MustParseAddrPort("10.0.0.53:53"), dst: netip.MustParseAddrPort("10.0.0.2:40000"), tcp: true, seq: seq, syn: syn, payload: payload}
}

func TestTCPStreams(t *testing.T) {
	msg := func(b ...byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...) }
	var ts tcpStreams
	if got := ts.add(seg(99, true, nil)); got != nil {
		t.Fatal(got)
	}
	two := append(msg(1, 2, 3), msg(4, 5)...)
	// The first message split over two segments, the second whole in the second.
	if got := ts.add(seg(100, false, two[:3])); len(got) != 0 {
		t.Fatalf("an incomplete message: %v", got)
	}
	got := ts.add(seg(103, false, two[3:]))
	if len(got) != 2 || !slices.Equal(got[0], []byte{1, 2, 3}) || !slices.Equal(got[1], []byte{4, 5}) {
		t.Fatalf("messages %v", got)
	}
	// A retransmission is let through unread; a gap gives the stream up.
	if got := ts.add(seg(103, false, two[3:])); len(got) != 0 {
		t.Errorf("a retransmission was read again: %v", got)
	}
	if got := ts.add(seg(200, false, msg(9))); len(got) != 0 {
		t.Errorf("a segment after a gap was read: %v", got)
	}
	if got := ts.add(seg(uint32(100+len(two)), false, msg(7))); len(got) != 0 {
		t.Errorf("a broken stream was read: %v", got)
	}
	// A segment of a stream not seen from its start is not read.
	other := seg(5000, false, msg(1))
	other.dst = netip.MustParseAddrPort("10.0.0.2:40001")
	if got := ts.add(other); len(got) != 0 {
		t.Errorf("a stream seen midway was read: %v", got)
	}
}

func TestParseSegment(t *testing.T) {
	// An IPv4 UDP packet from 10.0.0.53:53.
	payload := []byte("dns")
	b := make([]byte, 20+8+len(payload))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[9] = 17
	copy(b[12:16], []byte{10, 0, 0, 53})
	copy(b[16:20], []byte{10, 0, 0, 2})
	binary.BigEndian.PutUint16(b[20:], 53)
	binary.BigEndian.PutUint16(b[22:], 40000)
	copy(b[28:], payload)
	s, ok := parseSegment(b)
	if !ok || s.tcp || s.src != netip.MustParseAddrPort("10.0.0.53:53") || string(s.payload) != "dns" {
		t.Errorf("%+v %v", s, ok)
	}
	b[6] = 0x20 // more fragments
	if _, ok := parseSegment(b); ok {
		t.Error("a fragment was read")
	}
}

// learn learns and writes as the reader does.
func learn(l *Learner, a answer, server netip.Addr) { l.write(l.learn(a, server)) }

// fakeBackend records what the learner writes.
type fakeBackend struct{ admitted []policy.LearnedElement }

func (f *fakeBackend) SetLearnedSource(policy.LearnedSource) {}
func (f *fakeBackend) Admit(e []policy.LearnedElement) error {
	f.admitted = append(f.admitted, e...)
	return nil
}

// TestLearn: an answer admits its addresses for every pattern a name on its chain matches,
// for TTL + grace; a later answer extends but never cuts the time; an expired address still
// counts for established flows for History, and is forgotten after.
func TestLearn(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fb := &fakeBackend{}
	l := New(Config{Grace: 5 * time.Second, History: time.Minute}, fb)
	l.now = func() time.Time { return now }
	l.patterns = map[string]string{"dom-a": "*.example.com", "dom-b": "api.example.org", "dom-c": "other.net"}
	server := netip.MustParseAddr("10.0.0.53")
	l.servers = []netip.Addr{server}
	addr := netip.MustParseAddr("192.0.2.1")
	learn(l, answer{question: "api.example.org", names: []string{"api.example.org", "lb.example.com"},
		addrs: []answerAddr{{addr, 30 * time.Second}}}, server)
	if len(fb.admitted) != 2 {
		t.Fatalf("admitted %+v, want the address in dom-a and dom-b", fb.admitted)
	}
	for _, e := range fb.admitted {
		if e.Timeout != 35*time.Second || e.Addr != addr || e.Comment == "" {
			t.Errorf("element %+v", e)
		}
	}
	// A shorter answer does not cut the time; a longer one extends it.
	fb.admitted = nil
	learn(l, answer{question: "x.example.com", names: []string{"x.example.com"}, addrs: []answerAddr{{addr, 10 * time.Second}}}, server)
	if len(fb.admitted) != 0 {
		t.Errorf("a shorter answer was written: %+v", fb.admitted)
	}
	learn(l, answer{question: "x.example.com", names: []string{"x.example.com"}, addrs: []answerAddr{{addr, 100 * time.Second}}}, server)
	if len(fb.admitted) != 1 || fb.admitted[0].Timeout != 105*time.Second {
		t.Errorf("a longer answer: %+v", fb.admitted)
	}
	// An answer from another server is not believed.
	fb.admitted = nil
	learn(l, answer{question: "y.example.com", names: []string{"y.example.com"}, addrs: []answerAddr{{netip.MustParseAddr("192.0.2.2"), time.Minute}}}, netip.MustParseAddr("10.0.0.99"))
	if len(fb.admitted) != 0 || l.Admits("dom-a", netip.MustParseAddr("192.0.2.2")) {
		t.Errorf("an answer of another server was believed")
	}
	if got := l.Learned("dom-a"); len(got) != 1 || got[0].Timeout != 105*time.Second {
		t.Errorf("Learned: %+v", got)
	}
	now = now.Add(110 * time.Second) // expired, within History
	if len(l.Learned("dom-a")) != 0 || !l.Admits("dom-a", addr) {
		t.Errorf("expired: Learned %v, Admits %v", l.Learned("dom-a"), l.Admits("dom-a", addr))
	}
	l.Prune()
	if !l.Admits("dom-a", addr) {
		t.Error("pruned within History")
	}
	now = now.Add(2 * time.Minute)
	l.Prune()
	if l.Admits("dom-a", addr) || l.Admits("dom-b", addr) {
		t.Error("kept after History")
	}
}
