package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// kernelElements counts the elements the kernel holds in each of sets (names in table inet
// netwarden, in the order given) and digests them, over netlink. An interval's end marker is
// not counted: nft lists an interval as one element, as the renderer counts it. Listing a set
// of 150,000 elements this way takes a fraction of what nft's JSON listing and its parse take,
// and the drift check holds the sync loop for as long as it runs.
func kernelElements(ctx context.Context, sets []string) (map[string]int, string, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	counts := make(map[string]int, len(sets))
	h := sha256.New()
	for _, name := range sets {
		attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(TableName + "\x00")},
			{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(name + "\x00")},
		})
		if err != nil {
			return nil, "", err
		}
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request | netlink.Dump},
			Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
		})
		if err != nil {
			return nil, "", fmt.Errorf("dumping the elements of set %s: %w", name, err)
		}
		h.Write([]byte(name + "\x00"))
		n := 0
		for _, m := range msgs {
			if len(m.Data) < 4 {
				continue
			}
			k, err := countElements(m.Data[4:], h)
			if err != nil {
				return nil, "", fmt.Errorf("elements of set %s: %w", name, err)
			}
			n += k
		}
		counts[name] = n
	}
	return counts, hex.EncodeToString(h.Sum(nil)), nil
}

// countElements counts the elements of one NFT_MSG_NEWSETELEM message's attributes that are
// not an interval's end, and writes every element to h.
func countElements(attrs []byte, h interface{ Write([]byte) (int, error) }) (int, error) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return 0, err
	}
	n := 0
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				if list.Type() != unix.NFTA_LIST_ELEM {
					continue
				}
				elem := list.Bytes()
				h.Write(elem)
				end, err := intervalEnd(elem)
				if err != nil {
					return err
				}
				if !end {
					n++
				}
			}
			return nil
		})
	}
	return n, ad.Err()
}

// intervalEnd reports whether an element's attributes mark it as the end of an interval.
func intervalEnd(elem []byte) (bool, error) {
	ad, err := netlink.NewAttributeDecoder(elem)
	if err != nil {
		return false, err
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_SET_ELEM_FLAGS && len(ad.Bytes()) == 4 {
			return binary.BigEndian.Uint32(ad.Bytes())&unix.NFT_SET_ELEM_INTERVAL_END != 0, nil
		}
	}
	return false, ad.Err()
}
