package cni

import (
	"errors"
	"fmt"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nftnl"
)

// nftNetlink reads and deletes our rules over netlink: listing a bucket and deleting an
// attachment then costs no nft process (whose start-up is most of a small change's latency),
// and the deletions go to the kernel as one batch, one transaction.
//
// Every nftNetlink of a store shares the store's one socket (nftnl.Conn). A socket per
// operation would be closed right after a deleting commit, and that close waits out an RCU
// grace period; the shared socket is released once, when the verb is done (Store.Release),
// which leaves that wait to the kernel.
type nftNetlink struct {
	shared *nftnl.Conn
	table  *gnft.Table
	// pending are the changes queued for the next commit, sent in one nftnl.Conn.Batch so
	// that a failure anywhere drops all of them.
	pending []func(*gnft.Conn)
}

func newNFTNetlink(shared *nftnl.Conn, table string) *nftNetlink {
	return &nftNetlink{shared: shared, table: &gnft.Table{Name: table, Family: gnft.TableFamilyINet}}
}

func (n *nftNetlink) chain(name string) *gnft.Chain { return &gnft.Chain{Name: name, Table: n.table} }

// rules lists a chain's rules; a missing table or chain is errNFTNotFound.
func (n *nftNetlink) rules(chain string) ([]nftRule, error) {
	conn, err := n.shared.Get()
	if err != nil {
		return nil, err
	}
	rs, err := conn.GetRules(n.table, n.chain(chain))
	// google/nftables does not always wrap the errno, so the text decides too.
	if errors.Is(err, unix.ENOENT) || (err != nil && strings.Contains(err.Error(), "no such file or directory")) {
		return nil, fmt.Errorf("chain %s: %w", chain, errNFTNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("nftables netlink: list chain %s: %w", chain, err)
	}
	out := make([]nftRule, 0, len(rs))
	for _, r := range rs {
		comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		out = append(out, nftRule{Chain: chain, Handle: int(r.Handle), Comment: comment})
	}
	return out, nil
}

// chainExists reports whether the table holds chain.
func (n *nftNetlink) chainExists(name string) (bool, error) {
	conn, err := n.shared.Get()
	if err != nil {
		return false, err
	}
	_, err = conn.ListChain(n.table, name)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file or directory") {
		return false, nil
	}
	return false, fmt.Errorf("nftables netlink: get chain %s: %w", name, err)
}

func (n *nftNetlink) deleteRule(r nftRule) {
	n.pending = append(n.pending, func(c *gnft.Conn) {
		c.DelRule(&gnft.Rule{Table: n.table, Chain: n.chain(r.Chain), Handle: uint64(r.Handle)})
	})
}

// deleteChain queues the removal of a chain and its rules.
func (n *nftNetlink) deleteChain(name string) {
	n.pending = append(n.pending, func(c *gnft.Conn) {
		c.FlushChain(n.chain(name))
		c.DelChain(n.chain(name))
	})
}

func (n *nftNetlink) addChain(name string) {
	n.pending = append(n.pending, func(c *gnft.Conn) { c.AddChain(n.chain(name)) })
}

// addRule queues a rule at the end of chain, with comment when it is not empty.
func (n *nftNetlink) addRule(chain string, exprs []expr.Any, comment string) {
	var ud []byte
	if comment != "" {
		ud = userdata.AppendString(nil, userdata.TypeComment, comment)
	}
	n.pending = append(n.pending, func(c *gnft.Conn) {
		c.AddRule(&gnft.Rule{Table: n.table, Chain: n.chain(chain), Exprs: exprs, UserData: ud})
	})
}

// commit sends the queued changes as one transaction.
func (n *nftNetlink) commit() error {
	if len(n.pending) == 0 {
		return nil
	}
	pending := n.pending
	n.pending = nil
	err := n.shared.Batch(func(c *gnft.Conn) error {
		for _, queue := range pending {
			queue(c)
		}
		return nil
	})
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file or directory") {
		return fmt.Errorf("nftables netlink: %w: %v", errNFTNotFound, err)
	}
	return err
}
