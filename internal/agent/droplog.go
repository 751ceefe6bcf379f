package agent

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/kernel/nflog"
	"github.com/netwarden/netwarden/internal/policy"
)

// dropLog turns the packets the kernel logs at policy drops into log lines and metrics. It
// resolves a packet's drop ID against the Ruleset the kernel holds and its addresses against
// the cluster state, both only when a drop arrives, so that syncs pay nothing for it.
type dropLog struct {
	a    *Agent
	conn *nflog.Conn

	// Caches, touched only by the reader goroutine.
	reasonsOf *policy.Ruleset
	reasons   map[string]policy.DropReason
	podsOf    *cluster.State
	pods      map[netip.Addr]string
	seen      map[flowKey]time.Time
}

// flowKey identifies one connection attempt: a client retrying within it (a TCP SYN sent
// again) reuses its ports, and each retry is new to conntrack as the first was dropped.
type flowKey struct {
	proto            uint8
	src, dst         netip.Addr
	srcPort, dstPort uint16
}

// dedupWindow is how long a denied attempt's retries are recognised: TCP gives up on a SYN
// after about two minutes, but most clients after far less; a retry after the window is logged
// again, which is a line too many, not one too few.
const (
	dedupWindow = 30 * time.Second
	maxSeen     = 1 << 14
)

func openDropLog(a *Agent, cfg *policy.DropLog) (*dropLog, error) {
	conn, err := nflog.Open(cfg.Group)
	if err != nil {
		return nil, err
	}
	a.metrics.registerDropLog(a.np.DropLog != nil)
	return &dropLog{a: a, conn: conn, seen: map[flowKey]time.Time{}}, nil
}

// run reads until ctx is done.
func (d *dropLog) run(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { _ = d.conn.SetReadDeadline(time.Now()) })
	defer stop()
	defer d.conn.Close()
	for {
		pkts, err := d.conn.Receive()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, nflog.ErrLost) {
			d.a.metrics.dropLogLost.Inc()
			continue
		}
		if err != nil {
			d.a.log.Error("drop log: reading NFLOG failed; drops are no longer logged", "err", err)
			return
		}
		for _, p := range pkts {
			d.handle(p, time.Now())
		}
	}
}

func (d *dropLog) handle(p nflog.Packet, now time.Time) {
	if !strings.HasPrefix(p.Prefix, policy.DropIDPrefix) {
		return // another program's log rule uses our group
	}
	if d.handleStaged(p, now) {
		return
	}
	reason, ok := d.reason(p.Prefix)
	dir := string(reason.Direction)
	if !ok {
		dir = "unknown"
	}
	d.a.metrics.droppedPackets.WithLabelValues(dir, reason.Namespace(), reason.PolicyLabel()).Inc()
	if d.duplicate(p, now) {
		return
	}
	attrs := d.flowAttrs([]any{"direction", dir}, p)
	if ok {
		attrs = append(attrs, "reason", reason.String())
		if reason.ClusterPolicy != "" {
			attrs = append(attrs, "clusterPolicy", reason.ClusterPolicy, "rule", reason.Rule)
		} else {
			attrs = append(attrs, "policies", strings.Join(reason.Policies, ","))
		}
	} else {
		// The rules changed since the packet was logged.
		attrs = append(attrs, "reason", "rule "+p.Prefix+" no longer in the applied rules")
	}
	d.a.log.Info("packet dropped by policy", attrs...)
}

// flowAttrs appends to attrs the log attributes of p's connection: both pods and addresses,
// the protocol and the destination port.
func (d *dropLog) flowAttrs(attrs []any, p nflog.Packet) []any {
	attrs = append(attrs, "src", d.pod(p.Src), "srcIP", p.Src.String(), "dst", d.pod(p.Dst), "dstIP", p.Dst.String(),
		"proto", nflog.ProtoName(p.Proto))
	if p.DstPort != 0 {
		attrs = append(attrs, "port", p.DstPort)
	}
	return attrs
}

// duplicate reports whether p is a retry of an attempt logged within dedupWindow, and
// remembers it otherwise.
func (d *dropLog) duplicate(p nflog.Packet, now time.Time) bool {
	key := flowKey{proto: p.Proto, src: p.Src, dst: p.Dst, srcPort: p.SrcPort, dstPort: p.DstPort}
	if t, dup := d.seen[key]; dup && now.Sub(t) < dedupWindow {
		return true
	}
	if len(d.seen) >= maxSeen {
		for k, t := range d.seen {
			if now.Sub(t) >= dedupWindow {
				delete(d.seen, k)
			}
		}
		if len(d.seen) >= maxSeen {
			clear(d.seen)
		}
	}
	d.seen[key] = now
	return false
}

func (d *dropLog) reason(id string) (policy.DropReason, bool) {
	rs := d.a.applied.Load()
	if rs == nil {
		return policy.DropReason{}, false
	}
	if rs != d.reasonsOf {
		d.reasons, d.reasonsOf = policy.DropReasons(rs), rs
	}
	r, ok := d.reasons[id]
	return r, ok
}

// pod names the pod holding ip, "namespace/name", or "-" when none does (a host or an
// address outside the cluster).
func (d *dropLog) pod(ip netip.Addr) string {
	st := d.a.cfg.Source.Snapshot()
	if st != d.podsOf {
		d.pods, d.podsOf = map[netip.Addr]string{}, st
		for key, p := range st.Pods.All() {
			// A finished pod may have left its IP to a new one.
			if p.HostNetwork || p.Phase == corev1.PodSucceeded || p.Phase == corev1.PodFailed {
				continue
			}
			for _, a := range p.IPs {
				d.pods[a] = key
			}
		}
	}
	if name, ok := d.pods[ip.Unmap()]; ok {
		return name
	}
	return "-"
}
