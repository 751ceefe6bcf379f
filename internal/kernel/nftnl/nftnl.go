// Package nftnl holds what every netwarden nftables backend needs to talk to the kernel over
// netlink directly (github.com/google/nftables) rather than through the nft CLI: one socket
// kept open, and the kernel's encoding of interval-set elements.
package nftnl

import (
	"fmt"
	"net/netip"

	gnft "github.com/google/nftables"
)

// Conn is one nfnetlink socket kept open for the life of its owner.
//
// Why not a socket per transaction: the kernel frees what a commit deletes (elements, rules,
// chains) only after an RCU grace period, and closing an nfnetlink socket waits for that
// pending free (nft_rcv_nl_event flushes nf_tables' destroy work). On this class of machine
// that costs 11–25 ms for every transaction that deletes anything, against tens of
// microseconds for the commit itself. A socket that stays open lets the kernel finish the
// free in the background; the commit is already visible to packets when Flush returns.
//
// The nft CLI closes its socket when it exits, so every nft run that deletes pays the wait.
// An owner that exits itself (a CNI plugin) calls Release, which leaves the wait to the kernel.
//
// A Conn is not safe for concurrent use; each backend owns one.
type Conn struct {
	conn *gnft.Conn
	sock *socket
}

// Get opens the socket on first use, in the calling thread's network namespace (the one the
// nft CLI would run in for the same call). It is for queries; changes go through Batch.
func (c *Conn) Get() (*gnft.Conn, error) {
	if c.conn == nil {
		sock, err := openSocket()
		if err != nil {
			return nil, fmt.Errorf("nftables netlink: %w", err)
		}
		conn, err := gnft.New(gnft.AsLasting(), gnft.WithTestDial(sock.exchange))
		if err != nil {
			sock.close()
			return nil, fmt.Errorf("nftables netlink: %w", err)
		}
		c.conn, c.sock = conn, sock
	}
	return c.conn, nil
}

// reset drops the socket, so that no queued message or pending reply of a failed batch
// leaks into the next one.
func (c *Conn) reset() { c.drop((*socket).close) }

// Release closes the socket, if open, for an owner that is about to exit: a short-lived
// process such as a CNI plugin, whose exit would otherwise wait for the kernel's deferred free
// of what its last commit deleted. The Conn can be used again afterwards.
func (c *Conn) Release() { c.drop((*socket).release) }

// drop lets go of the socket, if open, ending it with end.
func (c *Conn) drop(end func(*socket)) {
	if c.conn != nil {
		c.conn.CloseLasting()
		end(c.sock)
		c.conn, c.sock = nil, nil
	}
}

// Batch sends what fill queues as one netlink batch, which the kernel commits as one
// transaction. If fill or the commit fails, the socket is dropped with whatever it had queued.
func (c *Conn) Batch(fill func(*gnft.Conn) error) error {
	conn, err := c.Get()
	if err != nil {
		return err
	}
	if err := fill(conn); err != nil {
		c.reset()
		return err
	}
	if err := conn.Flush(); err != nil {
		c.reset()
		return fmt.Errorf("nftables netlink batch: %w", err)
	}
	return nil
}

// IntervalElements encodes the address range [first, last] of a single-field interval set
// exactly as nft does, so that elements added by the CLI can be deleted over netlink and the
// other way round: a start element at first and an interval-end element at last+1, which is
// left out when last is the family's highest address.
//
// nft also puts an interval-end element at the zero address in front of a set whose first
// range does not start there. Lookups do not need it, so this never adds or removes it.
func IntervalElements(first, last netip.Addr) []gnft.SetElement {
	out := []gnft.SetElement{{Key: first.AsSlice()}}
	if next := last.Next(); next.IsValid() {
		out = append(out, gnft.SetElement{Key: next.AsSlice(), IntervalEnd: true})
	}
	return out
}
