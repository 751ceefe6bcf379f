package agent

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
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

// checkIPVS returns errIPVS when kube-proxy's IPVS interface exists in this network namespace,
// and sets the metric either way.
func (a *Agent) checkIPVS() error {
	_, err := netlink.LinkByName(ipvsInterface)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil:
		a.metrics.enforcementRefused.WithLabelValues("kube-proxy-ipvs").Set(1)
		return errIPVS
	case errors.As(err, &notFound):
		a.metrics.enforcementRefused.WithLabelValues("kube-proxy-ipvs").Set(0)
		return nil
	default:
		return fmt.Errorf("looking for kube-proxy's IPVS interface %s: %w", ipvsInterface, err)
	}
}
