package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ipvsInterface is the dummy interface kube-proxy's IPVS mode binds every Service address to.
const ipvsInterface = "kube-ipvs0"

// errIPVS is why the NetworkPolicy feature refuses to enforce on a node whose kube-proxy runs
// in IPVS mode. IPVS takes a Service packet in the input hook, addressed to the Service, and
// sends it to its endpoint from there: a pod's egress would be judged against the Service
// address, not the endpoint's, and a same-node endpoint's ingress never crosses the forward
// hook at all. Judging part of the traffic and calling it enforced would be a silent bypass;
// the agent says so instead: every sync fails with this error (in the log, /status and
// netwarden_sync_errors_total), /readyz stays unready, and netwarden_enforcement_refused
// {reason="kube-proxy-ipvs"} is 1. Rules an earlier run left stay in place. Once the
// interface is gone (kube-proxy moved to nftables or iptables mode), the next retry syncs.
var errIPVS = errors.New("kube-proxy runs in IPVS mode here (interface " + ipvsInterface + " exists): IPVS delivers Service traffic past the hooks NetworkPolicy is judged in, so netwarden refuses to enforce; run kube-proxy in nftables or iptables mode")

// ipvsWatch knows whether the IPVS interface exists from the kernel's link notifications, so
// that a sync reads a flag instead of asking the kernel (a netlink round trip of some 30 us).
// Without a subscription (agent --once, or one that failed), each sync asks.
type ipvsWatch struct {
	watching atomic.Bool
	present  atomic.Bool
}

// watch subscribes to link changes until ctx is done, the existing links listed first.
func (w *ipvsWatch) watch(ctx context.Context, log *slog.Logger) {
	updates := make(chan netlink.LinkUpdate, 64)
	err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
		ListExisting: true,
		// A lost notification (or a broken subscription) goes back to asking at every sync.
		ErrorCallback: func(error) { w.watching.Store(false) },
	})
	if err != nil {
		log.Warn("cannot follow link changes; every sync looks for kube-proxy's IPVS interface", "err", err)
		return
	}
	present, err := lookupIPVS()
	if err != nil {
		return
	}
	w.present.Store(present)
	w.watching.Store(true)
	go func() {
		index := int32(0) // of the IPVS interface, while it exists
		for u := range updates {
			switch {
			case u.Header.Type == unix.RTM_NEWLINK && u.Attrs().Name == ipvsInterface:
				index = u.Index
				w.present.Store(true)
			case index != 0 && u.Index == index: // deleted, or renamed away
				index = 0
				w.present.Store(false)
			}
		}
	}()
}

func lookupIPVS() (bool, error) {
	_, err := netlink.LinkByName(ipvsInterface)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &notFound):
		return false, nil
	default:
		return false, fmt.Errorf("looking for kube-proxy's IPVS interface %s: %w", ipvsInterface, err)
	}
}

// checkIPVS returns errIPVS when kube-proxy's IPVS interface exists in this network namespace,
// and sets the metric either way.
func (a *Agent) checkIPVS() error {
	present := a.ipvs.present.Load()
	if !a.ipvs.watching.Load() {
		var err error
		if present, err = lookupIPVS(); err != nil {
			return err
		}
	}
	v := 0.0
	if present {
		v = 1
	}
	a.metrics.enforcementRefused.WithLabelValues("kube-proxy-ipvs").Set(v)
	if present {
		return errIPVS
	}
	return nil
}
