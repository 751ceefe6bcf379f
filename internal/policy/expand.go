package policy

import "iter"

// Match is what one kernel rule of a model rule matches: one peer, one port match and one of
// its ranges, in one IP family.
type Match struct {
	Peer    Peer      // the zero Peer is any peer
	Port    PortMatch // the zero PortMatch is any protocol and port
	Range   PortRange // meaningful unless AnyPort
	AnyPort bool      // Port lists no ranges: every port of its protocol
	IPv6    bool
}

// Matches expands a rule (any of peers, any of ports; none listed means any) into the kernel
// rules both backends write: one per peer, port range and IP family, in that nesting. An
// ipBlock peer needs its own family only; any other peer both, since nothing in its rule is
// family-specific apart from the set of the family.
func Matches(peers []Peer, ports []PortMatch) iter.Seq[Match] {
	if len(peers) == 0 {
		peers = []Peer{{}}
	}
	if len(ports) == 0 {
		ports = []PortMatch{{}}
	}
	return func(yield func(Match) bool) {
		for _, peer := range peers {
			families := []bool{false, true}
			if peer.CIDRSet != "" {
				families = []bool{peer.IPv6}
			}
			for _, port := range ports {
				ranges, anyPort := port.Ranges, len(port.Ranges) == 0
				if anyPort {
					ranges = []PortRange{{}}
				}
				for _, v6 := range families {
					for _, r := range ranges {
						if !yield(Match{Peer: peer, Port: port, Range: r, AnyPort: anyPort, IPv6: v6}) {
							return
						}
					}
				}
			}
		}
	}
}
