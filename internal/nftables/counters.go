package nftables

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/policy"
)

// SetPolicyCounters implements policy.PolicyCounters: every rule that ends a policy's
// judgement (a NetworkPolicy's accepts, each ClusterNetworkPolicy rule, and a group's drop)
// gets an anonymous counter. It adds work only to the packets such a rule matches, the first
// of each connection, and no object of its own: the counters come and go with their rules, so
// an incremental sync stays what it was. The next sync renders every chain anew.
func (b *Backend) SetPolicyCounters(on bool) {
	b.renderer = b.renderer.anew(func(r *Renderer) { r.counters = on })
}

// ReadCounters implements policy.PolicyCounters. It dumps the table's rules over netlink,
// without their sets, which is what makes it cheap next to a listing (the sets hold most of a
// large table), and it takes no lock a sync needs: the kernel serves the dump from its rules
// as they are.
func (b *Backend) ReadCounters(ctx context.Context) ([]policy.RuleCounter, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")}})
	if err != nil {
		return nil, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dumping the rules of table inet %s: %w", TableName, err)
	}
	var out []policy.RuleCounter
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		if rc, ok := parseCountedRule(m.Data[4:]); ok {
			out = append(out, rc)
		}
	}
	return out, nil
}

// ReadStagedCounters implements policy.StagedReporter: the counters of the chains recording
// the differences staged policies would make, read as ReadCounters reads.
func (b *Backend) ReadStagedCounters(ctx context.Context) ([]policy.StagedCounter, error) {
	rules, err := b.ReadCounters(ctx)
	if err != nil {
		return nil, err
	}
	var out []policy.StagedCounter
	for _, r := range rules {
		chain, _, _ := strings.Cut(r.Rule, "#")
		if outcome, cause, ok := parseOutcomeChain(chain); ok {
			out = append(out, policy.StagedCounter{Cause: cause, Outcome: outcome, Rule: r.Rule, Packets: r.Packets})
		}
	}
	return out, nil
}

// parseCountedRule reads a rule message; ok is false for a rule without a counter.
func parseCountedRule(b []byte) (policy.RuleCounter, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return policy.RuleCounter{}, false
	}
	ad.ByteOrder = binary.BigEndian
	var chain string
	var handle uint64
	counted := false
	var rc policy.RuleCounter
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			handle = ad.Uint64()
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					list.Nested(func(e *netlink.AttributeDecoder) error {
						e.ByteOrder = binary.BigEndian
						var name string
						var data []byte
						for e.Next() {
							switch e.Type() {
							case unix.NFTA_EXPR_NAME:
								name = e.String()
							case unix.NFTA_EXPR_DATA:
								data = e.Bytes()
							}
						}
						switch name {
						case "counter":
							counted = true
							rc.Packets = nestedUint64(data, unix.NFTA_COUNTER_PACKETS)
						case "immediate":
							rc.Verdict = verdictOf(data)
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	if ad.Err() != nil || !counted {
		return rc, false
	}
	rc.Source = chainSource(chain)
	rc.Rule = chain + "#" + strconv.FormatUint(handle, 10)
	return rc, true
}

func nestedUint64(b []byte, typ uint16) uint64 {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return 0
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == typ {
			return ad.Uint64()
		}
	}
	return 0
}

// verdictOf names the verdict of an immediate expression the way the counters report it: a
// goto to a drop chain drops, a goto to the admin pass chain passes.
func verdictOf(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	ad.ByteOrder = binary.BigEndian
	verdict := ""
	for ad.Next() {
		if ad.Type() != unix.NFTA_IMMEDIATE_DATA {
			continue
		}
		ad.Nested(func(d *netlink.AttributeDecoder) error {
			for d.Next() {
				if d.Type() != unix.NFTA_DATA_VERDICT {
					continue
				}
				d.Nested(func(v *netlink.AttributeDecoder) error {
					v.ByteOrder = binary.BigEndian
					var code int32
					var target string
					for v.Next() {
						switch v.Type() {
						case unix.NFTA_VERDICT_CODE:
							code = int32(v.Uint32())
						case unix.NFTA_VERDICT_CHAIN:
							target = v.String()
						}
					}
					switch {
					case code == 1: // NF_ACCEPT
						verdict = "accept"
					case code == 0 && target == "", strings.HasPrefix(target, "drop-"), strings.HasPrefix(target, "staged-denied-"):
						verdict = "drop"
					case strings.HasPrefix(target, "admin-pass"):
						verdict = "pass"
					}
					return nil
				})
			}
			return nil
		})
	}
	return verdict
}

// chainSource is the Ruleset key a group, policy or ClusterNetworkPolicy chain renders.
func chainSource(chain string) string {
	if s, ok := strings.CutSuffix(chain, "-v4"); ok {
		return s
	}
	return strings.TrimSuffix(chain, "-v6")
}
