package domains

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/netwarden/netwarden/internal/kernel/nftexpr"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
)

// SteerTable is the name of the tables (ip and ip6) holding the queue rules. They are tables
// of their own, not part of the NetworkPolicy table: nft lists the NFQUEUE target of an inet
// table only with a warning, and a full sync of the policy table must not touch them.
const SteerTable = "netwarden-dns"

// steering is the queue rules in the kernel: every DNS reply (UDP or TCP source port 53) from
// a believed server, in conntrack's reply direction, forwarded to a pod or sent by the node,
// is queued to the learner, with bypass so that it passes while nobody reads the queue.
// Other UDP replies from port 53 to anyone but a believed server (whose own queries upstream
// are answered from port 53 too) are only counted, as the answers refused.
type steering struct {
	conn    nftnl.Conn
	queue   uint16
	servers []netip.Addr // what the kernel holds; nil with on false
	on      bool
	// refusedBase is what the counters of tables since replaced had counted.
	refusedBase uint64
}

// Priority of the chains: mangle (-150), ahead of every filter chain, so that a reply is
// learned before any rule judges it (and a reply dropped later was still an answer the
// server gave).
const steerPriority = -150

func (s *steering) sync(servers []netip.Addr, on bool) error {
	if s.on == on && equalAddrs(s.servers, servers) {
		return nil
	}
	if n, err := s.counted(); err == nil {
		s.refusedBase += n
	}
	err := s.conn.Batch(func(c *gnft.Conn) error {
		for _, v6 := range []bool{false, true} {
			fam := gnft.TableFamilyIPv4
			if v6 {
				fam = gnft.TableFamilyIPv6
			}
			t := &gnft.Table{Name: SteerTable, Family: fam}
			c.AddTable(t)
			c.DelTable(t)
			if !on {
				continue
			}
			c.AddTable(t)
			if err := s.fill(c, t, v6, servers); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tables %s: %w", SteerTable, err)
	}
	s.servers, s.on = servers, on
	return nil
}

func (s *steering) fill(c *gnft.Conn, t *gnft.Table, v6 bool, servers []netip.Addr) error {
	kt := gnft.TypeIPAddr
	if v6 {
		kt = gnft.TypeIP6Addr
	}
	set := &gnft.Set{Table: t, Name: "servers", KeyType: kt, Comment: "the cluster DNS servers whose answers are believed"}
	var elems []gnft.SetElement
	for _, a := range servers {
		if a.Is6() == v6 {
			elems = append(elems, gnft.SetElement{Key: a.AsSlice()})
		}
	}
	if err := c.AddSet(set, elems); err != nil {
		return err
	}
	info := make([]byte, 8) // struct xt_NFQ_info_v3, padded to 8 bytes as the kernel aligns it
	binary.NativeEndian.PutUint16(info[0:], s.queue)
	binary.NativeEndian.PutUint16(info[2:], 1) // one queue
	binary.NativeEndian.PutUint16(info[4:], 1) // NFQ_FLAG_BYPASS
	target := xt.Unknown(info)
	for _, hook := range []*gnft.ChainHook{gnft.ChainHookForward, gnft.ChainHookOutput} {
		name := "forwarded-replies"
		if hook == gnft.ChainHookOutput {
			name = "node-replies"
		}
		prio := gnft.ChainPriority(steerPriority)
		ch := c.AddChain(&gnft.Chain{Name: name, Table: t, Type: gnft.ChainTypeFilter, Hooknum: hook, Priority: &prio})
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			var e []expr.Any
			e = append(e, nftexpr.L4Proto(proto)...)
			e = append(e,
				&expr.Payload{DestRegister: nftexpr.Reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: nftexpr.Reg1, Data: nftexpr.BE16(53)},
			)
			queued := append(append([]expr.Any(nil), e...),
				nftexpr.LoadAddr(v6, true, nftexpr.Reg1),
				&expr.Lookup{SourceRegister: nftexpr.Reg1, SetName: set.Name, SetID: set.ID},
				&expr.Ct{Register: nftexpr.Reg1, Key: expr.CtKeyDIRECTION},
				&expr.Cmp{Op: expr.CmpOpEq, Register: nftexpr.Reg1, Data: []byte{1}}, // IP_CT_DIR_REPLY
				&expr.Target{Name: "NFQUEUE", Rev: 3, Info: &target},
			)
			c.AddRule(&gnft.Rule{Table: t, Chain: ch, Exprs: queued})
			if proto == unix.IPPROTO_UDP {
				// What reaches this rule came from port 53 but not from a believed server's
				// reply: counted, never learned.
				refused := append(e,
					nftexpr.LoadAddr(v6, false, nftexpr.Reg1),
					&expr.Lookup{SourceRegister: nftexpr.Reg1, SetName: set.Name, SetID: set.ID, Invert: true},
					&expr.Counter{})
				c.AddRule(&gnft.Rule{Table: t, Chain: ch, Exprs: refused})
			}
		}
	}
	return nil
}

// refused reads the count of UDP packets from port 53 that no believed server sent, since
// the learner started.
func (s *steering) refused() (uint64, error) {
	n, err := s.counted()
	return s.refusedBase + n, err
}

// counted reads the counters of the tables in the kernel.
func (s *steering) counted() (uint64, error) {
	if !s.on {
		return 0, nil
	}
	c, err := s.conn.Get()
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, fam := range []gnft.TableFamily{gnft.TableFamilyIPv4, gnft.TableFamilyIPv6} {
		t := &gnft.Table{Name: SteerTable, Family: fam}
		for _, ch := range []string{"forwarded-replies", "node-replies"} {
			rules, err := c.GetRules(t, &gnft.Chain{Name: ch, Table: t})
			if err != nil {
				return 0, err
			}
			for _, r := range rules {
				for _, e := range r.Exprs {
					if ctr, ok := e.(*expr.Counter); ok {
						n += ctr.Packets
					}
				}
			}
		}
	}
	return n, nil
}

// cleanup removes the tables.
func (s *steering) cleanup() error {
	s.on = true
	s.servers = []netip.Addr{netip.IPv4Unspecified()} // differ from any, so that sync writes
	return s.sync(nil, false)
}

func equalAddrs(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// verify reports how the kernel's queue rules differ from what the last sync wrote, and makes
// the next sync write them again when they do.
func (s *steering) verify() error {
	c, err := s.conn.Get()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(gnft.TableFamilyUnspecified)
	if err != nil {
		return err
	}
	found := 0
	for _, t := range tables {
		if t.Name == SteerTable && (t.Family == gnft.TableFamilyIPv4 || t.Family == gnft.TableFamilyIPv6) {
			found++
		}
	}
	why := ""
	switch {
	case !s.on && found > 0:
		why = "tables present while no domainNames peer is learned"
	case s.on && found != 2:
		why = fmt.Sprintf("%d of the 2 tables present", found)
	case s.on:
		for _, fam := range []gnft.TableFamily{gnft.TableFamilyIPv4, gnft.TableFamilyIPv6} {
			t := &gnft.Table{Name: SteerTable, Family: fam}
			for _, ch := range []string{"forwarded-replies", "node-replies"} {
				rules, err := c.GetRules(t, &gnft.Chain{Name: ch, Table: t})
				if err != nil || len(rules) != 3 {
					why = fmt.Sprintf("chain %s has %d rules, want 3 (%v)", ch, len(rules), err)
				}
			}
		}
	}
	if why == "" {
		return nil
	}
	s.servers, s.on = []netip.Addr{netip.IPv4Unspecified()}, !s.on // differ: the next sync writes
	return fmt.Errorf("tables %s drifted: %s", SteerTable, why)
}

// Cleanup removes the queue rules' tables, for `netwarden cleanup` and a backend switch.
func Cleanup(context.Context) error {
	s := &steering{}
	defer s.conn.Release()
	return s.cleanup()
}
