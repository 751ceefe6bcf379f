package nftnl

import (
	"fmt"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Comments are the comments of tables and chains that a batch creates. google/nftables has no
// field for them (it writes set comments only), so the transport adds them to the creating
// messages as nft does: a comment attribute in the object's user data.
type Comments struct {
	Tables map[string]string    // by table name
	Chains map[[2]string]string // by table and chain name
}

// Attribute numbers of the kernel's nf_tables.h that x/sys/unix does not name, and the type
// of a comment in libnftnl's user data of tables and chains.
const (
	nftaTableUserdata = 6
	nftaChainUserdata = 12
	udataComment      = 0
)

// BatchWithComments is Batch for a batch that creates tables or chains with comments.
func (c *Conn) BatchWithComments(comments Comments, fill func(*gnft.Conn) error) error {
	if _, err := c.Get(); err != nil {
		return err
	}
	c.sock.comments = &comments
	defer func() {
		if c.sock != nil {
			c.sock.comments = nil
		}
	}()
	return c.Batch(fill)
}

// withComment returns m with the comment comments give the table or chain it creates, if any.
func (cm *Comments) withComment(m netlink.Message) (netlink.Message, error) {
	var nameAttr, tableAttr, userdataAttr uint16
	switch m.Header.Type {
	case netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE):
		if len(cm.Tables) == 0 {
			return m, nil
		}
		nameAttr, userdataAttr = unix.NFTA_TABLE_NAME, nftaTableUserdata
	case netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN):
		if len(cm.Chains) == 0 {
			return m, nil
		}
		nameAttr, tableAttr, userdataAttr = unix.NFTA_CHAIN_NAME, unix.NFTA_CHAIN_TABLE, nftaChainUserdata
	default:
		return m, nil
	}
	const genmsgLen = 4 // struct nfgenmsg ahead of the attributes
	if len(m.Data) < genmsgLen {
		return m, nil
	}
	attrs, err := netlink.UnmarshalAttributes(m.Data[genmsgLen:])
	if err != nil {
		return m, fmt.Errorf("nfnetlink: decoding a message to comment: %w", err)
	}
	var name, table string
	for _, a := range attrs {
		switch a.Type {
		case nameAttr:
			name = cstring(a.Data)
		case tableAttr:
			table = cstring(a.Data)
		case userdataAttr:
			return m, nil // already has user data of its own
		}
	}
	comment := cm.Tables[name]
	if tableAttr != 0 {
		comment = cm.Chains[[2]string{table, name}]
	}
	if comment == "" {
		return m, nil
	}
	attrs = append(attrs, netlink.Attribute{Type: userdataAttr, Data: userdata.AppendString(nil, udataComment, comment)})
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return m, fmt.Errorf("nfnetlink: encoding a commented message: %w", err)
	}
	m.Data = append(m.Data[:genmsgLen:genmsgLen], b...)
	m.Header.Length = uint32(unix.NLMSG_HDRLEN + len(m.Data))
	return m, nil
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
