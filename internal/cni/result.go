package cni

import (
	"net/netip"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// ContainerIPs returns the IPs of the container's interfaces in a prevResult (an IP whose
// interface is unknown counts as the container's).
func ContainerIPs(res *current.Result) []netip.Prefix {
	var out []netip.Prefix
	for _, ipc := range res.IPs {
		if ipc.Interface != nil && *ipc.Interface >= 0 && *ipc.Interface < len(res.Interfaces) && res.Interfaces[*ipc.Interface].Sandbox == "" {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			continue
		}
		ones, _ := ipc.Address.Mask.Size()
		ip = ip.Unmap()
		if ip.Is4() && ones > 32 {
			ones -= 96
		}
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out
}
