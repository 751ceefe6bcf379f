package agent

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/conntrack"
	"github.com/netwarden/netwarden/internal/nftnl"
	"github.com/netwarden/netwarden/internal/policy"
)

// DefaultDenyMark is the conntrack mark bit of established flows a policy now denies.
const DefaultDenyMark = 0x20000000

// Why a mark and not a delete: the rules accept "ct state established" before any policy
// judges a packet, so an established flow outlives the policy that now denies it. Deleting
// its conntrack entry looks enough but is not: the next packet of the flow creates a new
// entry, and when that packet goes the other way (the server's next segment or datagram, or
// a mid-stream TCP segment picked up by nf_conntrack_tcp_loose) the policy judges it as a
// connection from the server to the client, which it usually allows, and the client's
// packets then pass as its replies: the flow goes on. Turning tcp_loose off would not help
// UDP, and would break every flow whose entry was lost for another reason (a full table, an
// agent that flushed it). So the entry stays, with the deny bit set in its mark, and the
// guard drops every packet of a marked entry, both ways, ahead of the established accept: the
// flow stops for good whoever sends next, and no new entry can take its place while it lives.
// A later change that allows the flow again clears the bit. Flows not judged by the new rules
// (no local pod isolated on either side) are never touched, nor are allowed ones.

// establishedPass re-judges every conntrack entry that concerns an isolated local pod (or
// carries the deny bit) with rs, and sets or clears the deny bit where the verdict differs.
func (a *Agent) establishedPass(rs *policy.Ruleset) error {
	mask := a.cfg.DenyMark
	if mask == 0 {
		return nil
	}
	if !a.anyMarked && !hasIsolation(rs) {
		return nil
	}
	start := time.Now()
	if a.ctSock == nil {
		s, err := nftnl.DialRaw()
		if err != nil {
			return fmt.Errorf("established flows: %w", err)
		}
		a.ctSock = s
	}
	flows, err := conntrack.Flows(a.ctSock)
	if err != nil {
		return fmt.Errorf("established flows: %w", err)
	}
	local := nodeAddrs()
	var deny, allow []conntrack.Flow
	marked := 0
	for _, f := range flows {
		was := f.Mark&mask != 0
		if !f.Src.IsValid() || !was && !concerns(rs, f) {
			continue
		}
		denied := judgeFlow(rs, f, local)
		switch {
		case denied && !was:
			deny = append(deny, f)
		case !denied && was:
			allow = append(allow, f)
		}
		if denied {
			marked++
		}
	}
	nd, err := conntrack.SetMarkBits(a.ctSock, deny, mask, true)
	if err != nil {
		return fmt.Errorf("established flows: %w", err)
	}
	na, err := conntrack.SetMarkBits(a.ctSock, allow, mask, false)
	if err != nil {
		return fmt.Errorf("established flows: %w", err)
	}
	a.anyMarked = marked > 0
	if nd+na > 0 {
		a.log.Info("established flows re-judged", "denied", nd, "allowedAgain", na, "entries", len(flows),
			"took", time.Since(start).Round(time.Microsecond))
	}
	return nil
}

func hasIsolation(rs *policy.Ruleset) bool {
	for _, d := range []map[policy.Direction]map[netip.Addr]string{rs.Dispatch, rs.Admin.Dispatch, rs.Baseline.Dispatch} {
		if len(d[policy.Ingress])+len(d[policy.Egress]) > 0 {
			return true
		}
	}
	return false
}

func judged(rs *policy.Ruleset, dir policy.Direction, addr netip.Addr) bool {
	for _, d := range []map[policy.Direction]map[netip.Addr]string{rs.Dispatch, rs.Admin.Dispatch, rs.Baseline.Dispatch} {
		if _, ok := d[dir][addr]; ok {
			return true
		}
	}
	return false
}

// flowDst is the destination the rules judged: after DNAT, the reply's source.
func flowDst(f conntrack.Flow) (netip.Addr, uint16) {
	if f.ReplySrc.IsValid() {
		return f.ReplySrc.Unmap(), f.ReplySrcPort
	}
	return f.Dst.Unmap(), f.DstPort
}

func concerns(rs *policy.Ruleset, f conntrack.Flow) bool {
	dst, _ := flowDst(f)
	return judged(rs, policy.Egress, f.Src.Unmap()) || judged(rs, policy.Ingress, dst)
}

// judgeFlow reports whether rs denies the flow, as the kernel would judge its first packet:
// egress of a local pod source, then ingress of a local pod destination unless the node
// itself sent it (its packets leave through output, which no policy chain sees).
func judgeFlow(rs *policy.Ruleset, f conntrack.Flow, nodeLocal map[netip.Addr]bool) bool {
	src := f.Src.Unmap()
	dst, port := flowDst(f)
	proto := protocolName(f.Protocol)
	if judged(rs, policy.Egress, src) && !rs.Judge(policy.Egress, src, dst, proto, port).Allowed {
		return true
	}
	if !nodeLocal[src] && judged(rs, policy.Ingress, dst) && !rs.Judge(policy.Ingress, dst, src, proto, port).Allowed {
		return true
	}
	return false
}

func protocolName(p uint8) policy.Protocol {
	switch p {
	case unix.IPPROTO_TCP:
		return policy.TCP
	case unix.IPPROTO_UDP:
		return policy.UDP
	case unix.IPPROTO_SCTP:
		return policy.SCTP
	}
	// No policy port names another protocol, so only rules without ports match it, as in
	// the kernel.
	return policy.Protocol(fmt.Sprintf("ip-proto-%d", p))
}

// nodeAddrs returns the addresses of this network namespace's interfaces.
func nodeAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out
}
