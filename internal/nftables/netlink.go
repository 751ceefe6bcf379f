package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// elementChange is one element to add to or delete from an existing set or verdict map.
type elementChange struct {
	set    string
	isMap  bool
	key    string // nft syntax: "10.0.0.1", "fd00::1", "10.0.0.1 . 80"
	value  string // verdict for map elements: "jump <chain>"
	delete bool
}

// applyElementsNetlink sends element changes as one netlink batch, which the kernel commits
// as one transaction. Pod churn only ever changes elements, and the nft CLI spends most of a
// small update loading its cache of our large table; talking netlink directly skips that.
func applyElementsNetlink(changes []elementChange) error {
	conn, err := gnft.New()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer conn.CloseLasting()
	table := &gnft.Table{Name: TableName, Family: gnft.TableFamilyINet}
	type batch struct {
		set      *gnft.Set
		add, del []gnft.SetElement
	}
	batches := map[string]*batch{}
	var order []string
	for _, ch := range changes {
		bt := batches[ch.set]
		if bt == nil {
			bt = &batch{set: &gnft.Set{Table: table, Name: ch.set, IsMap: ch.isMap}}
			batches[ch.set] = bt
			order = append(order, ch.set)
		}
		key, err := encodeKey(ch.key)
		if err != nil {
			return fmt.Errorf("set %s element %q: %w", ch.set, ch.key, err)
		}
		el := gnft.SetElement{Key: key}
		if ch.isMap && !ch.delete {
			chain, ok := strings.CutPrefix(ch.value, "jump ")
			if !ok {
				return fmt.Errorf("map %s element %q: unsupported value %q", ch.set, ch.key, ch.value)
			}
			el.VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}
		}
		if ch.delete {
			bt.del = append(bt.del, el)
		} else {
			bt.add = append(bt.add, el)
		}
	}
	// Deletions first, so a map key that changes value is replaced within the batch.
	for _, name := range order {
		if bt := batches[name]; len(bt.del) > 0 {
			if err := conn.SetDeleteElements(bt.set, bt.del); err != nil {
				return err
			}
		}
	}
	for _, name := range order {
		if bt := batches[name]; len(bt.add) > 0 {
			if err := conn.SetAddElements(bt.set, bt.add); err != nil {
				return err
			}
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("netlink batch: %w", err)
	}
	return nil
}

// encodeKey turns an element key in nft syntax into kernel data: addresses in network order,
// concatenation parts each padded to 4 bytes as nftables registers are.
func encodeKey(key string) ([]byte, error) {
	var out []byte
	for _, part := range strings.Split(key, " . ") {
		if a, err := netip.ParseAddr(part); err == nil {
			out = append(out, a.AsSlice()...)
			continue
		}
		port, err := strconv.ParseUint(part, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("cannot encode %q", part)
		}
		out = append(out, byte(port>>8), byte(port), 0, 0)
	}
	return out, nil
}
