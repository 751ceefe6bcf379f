package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/kernel/netipx"
	"github.com/netwarden/netwarden/internal/kernel/nftexpr"
	"github.com/netwarden/netwarden/internal/kernel/nftnl"
	"github.com/netwarden/netwarden/internal/policy"
)

// elementChange is one element to add to or delete from an existing set or verdict map.
type elementChange struct {
	set    string
	isMap  bool
	key    string // nft syntax: "10.0.0.1", "fd00::1", "10.0.0.1 . 80"
	value  string // verdict for map elements: "jump <chain>"
	delete bool
}

// elementsPerMessage bounds the elements of one netlink message: its element list is one
// attribute, at most 64 KiB, and an IPv6 interval element with its flags takes about 40 bytes.
const elementsPerMessage = 1000

// applyNetlink sends a plan as one netlink batch, which the kernel commits as one
// transaction. The nft CLI spends most of a small update loading its cache of our large
// table; talking netlink directly skips that, and the socket lc keeps open spares each
// deleting transaction a wait for the kernel's deferred free (see nftnl.Conn).
func applyNetlink(lc *nftnl.Conn, p *plan, old, new *Rendered, learnedOf func(string) []policy.LearnedElement) error {
	return lc.Batch(func(conn *gnft.Conn) error { return queuePlan(conn, p, old, new, learnedOf) })
}

// applyNetlinkFull replaces the table with new, whose every object p (its difference from an
// empty table) creates, in one netlink batch: the table is created if missing, deleted with
// all it holds, and created again, as the CLI's full sync does.
func applyNetlinkFull(lc *nftnl.Conn, p *plan, new *Rendered, learnedOf func(string) []policy.LearnedElement) error {
	comments := nftnl.Comments{Tables: map[string]string{TableName: tableComment}, Chains: map[[2]string]string{}}
	for name, c := range new.Chains {
		if c.comment != "" {
			comments.Chains[[2]string{TableName, name}] = c.comment
		}
	}
	return lc.BatchWithComments(comments, func(conn *gnft.Conn) error {
		table := &gnft.Table{Name: TableName, Family: gnft.TableFamilyINet}
		conn.AddTable(table)
		conn.DelTable(table)
		conn.AddTable(table)
		return queuePlan(conn, p, &Rendered{}, new, learnedOf)
	})
}

// queuePlan queues the messages of a plan on conn, in the order the batch needs them.
func queuePlan(conn *gnft.Conn, p *plan, old, new *Rendered, learnedOf func(string) []policy.LearnedElement) error {
	table := &gnft.Table{Name: TableName, Family: gnft.TableFamilyINet}
	sets := map[string]*gnft.Set{}
	setFor := func(name string, s *set) (*gnft.Set, error) {
		if gs := sets[name]; gs != nil {
			return gs, nil
		}
		kt, err := keyType(s.typ)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		gs := &gnft.Set{Table: table, Name: name, KeyType: kt, Concatenation: strings.Contains(s.typ, " . "),
			IsMap: s.isMap, Interval: s.interval, HasTimeout: s.learned, Comment: s.comment}
		if s.isMap {
			gs.DataType = gnft.TypeVerdict
		}
		sets[name] = gs
		return gs, nil
	}
	for _, name := range p.newSets {
		s := new.Sets[name]
		gs, err := setFor(name, s)
		if err != nil {
			return err
		}
		var elems []gnft.SetElement
		if s.interval {
			// A new interval set comes with all its ranges; the plan's per-element changes
			// of it are skipped below.
			if elems, err = newIntervalElements(s); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
		if s.learned {
			elems = gnftLearned(learnedOf(name))
		}
		first := elems[:min(len(elems), elementsPerMessage)]
		if err := conn.AddSet(gs, first); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		for chunk := range slices.Chunk(elems[len(first):], elementsPerMessage) {
			if err := conn.SetAddElements(gs, chunk); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
	}
	chains := map[string]*gnft.Chain{}
	chainFor := func(name string) *gnft.Chain {
		if c := chains[name]; c != nil {
			return c
		}
		c := &gnft.Chain{Name: name, Table: table}
		chains[name] = c
		return c
	}
	for _, name := range p.newChains {
		ch := chainFor(name)
		if c := new.Chains[name]; c.base != nil {
			if err := setHook(ch, c.base); err != nil {
				return fmt.Errorf("chain %s: %w", name, err)
			}
		}
		conn.AddChain(ch)
	}
	for _, name := range p.rewrite {
		ch := chainFor(name)
		if p.existed[name] {
			conn.FlushChain(ch)
		}
		for _, sp := range new.Chains[name].specs {
			exprs := sp.exprs()
			if sp.neighborDiscovery {
				// The types are an anonymous set, which lives and dies with its rule.
				types := &gnft.Set{Table: table, Anonymous: true, Constant: true, KeyType: gnft.TypeICMP6Type}
				var elems []gnft.SetElement
				for _, typ := range neighborDiscoveryTypes {
					elems = append(elems, gnft.SetElement{Key: []byte{typ}})
				}
				if err := conn.AddSet(types, elems); err != nil {
					return fmt.Errorf("chain %s: %w", name, err)
				}
				exprs = neighborDiscoveryExprs(types)
			}
			conn.AddRule(&gnft.Rule{Table: table, Chain: ch, Exprs: exprs})
		}
	}
	// Deletions first, so a map key that changes value is replaced within the batch.
	for _, del := range []bool{true, false} {
		batches := map[string][]gnft.SetElement{}
		var order []string
		for _, ch := range p.elems {
			if ch.delete != del || new.Sets[ch.set] != nil && new.Sets[ch.set].interval {
				continue
			}
			el, err := ch.setElement()
			if err != nil {
				return err
			}
			if _, ok := batches[ch.set]; !ok {
				order = append(order, ch.set)
			}
			batches[ch.set] = append(batches[ch.set], el)
		}
		for _, name := range order {
			s := new.Sets[name]
			if s == nil {
				s = old.Sets[name]
			}
			gs, err := setFor(name, s)
			if err != nil {
				return err
			}
			// A message's element list is one netlink attribute, whose length field has 16
			// bits: thousands of elements in one message overflow it.
			for chunk := range slices.Chunk(batches[name], elementsPerMessage) {
				if del {
					err = conn.SetDeleteElements(gs, chunk)
				} else {
					err = conn.SetAddElements(gs, chunk)
				}
				if err != nil {
					return fmt.Errorf("set %s: %w", name, err)
				}
			}
		}
	}
	for _, name := range p.goneChains {
		conn.FlushChain(chainFor(name))
	}
	for _, name := range p.goneChains {
		conn.DelChain(chainFor(name))
	}
	for _, name := range p.goneSets {
		conn.DelSet(&gnft.Set{Table: table, Name: name})
	}
	return nil
}

// newIntervalElements encodes the content of a new interval set as nft writes it when it
// creates a set with elements: an interval-end element at the zero address unless the first
// range starts there, then each range's start and the interval-end just past it, in key
// order with an end before a start at the same key (adjacent ranges stay separate, as nft
// without auto-merge keeps them). A range reaching the family's highest address is refused:
// nft marks it open in element user data, which netlink here does not write.
func newIntervalElements(s *set) ([]gnft.SetElement, error) {
	type bound struct {
		addr netip.Addr
		end  bool
	}
	var bounds []bound
	zero := netip.IPv4Unspecified()
	if s.typ == "ipv6_addr" {
		zero = netip.IPv6Unspecified()
	}
	for key := range s.Elements() {
		pfx, err := netip.ParsePrefix(key)
		if err != nil {
			a, aerr := netip.ParseAddr(key)
			if aerr != nil {
				return nil, fmt.Errorf("element %q is neither an address nor a prefix", key)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		first := pfx.Masked().Addr()
		last := netipx.LastAddr(pfx)
		next := last.Next()
		if !next.IsValid() {
			return nil, fmt.Errorf("element %q reaches the highest address", key)
		}
		bounds = append(bounds, bound{first, false}, bound{next, true})
	}
	slices.SortFunc(bounds, func(a, b bound) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		if a.end == b.end {
			return 0
		}
		if a.end {
			return -1
		}
		return 1
	})
	for i := 1; i < len(bounds); i++ {
		// Sorted starts and ends must alternate, or two ranges overlap.
		if bounds[i].end == bounds[i-1].end {
			return nil, fmt.Errorf("ranges overlap at %s", bounds[i].addr)
		}
	}
	var out []gnft.SetElement
	if len(bounds) > 0 && bounds[0].addr != zero {
		out = append(out, gnft.SetElement{Key: zero.AsSlice(), IntervalEnd: true})
	}
	for _, b := range bounds {
		out = append(out, gnft.SetElement{Key: b.addr.AsSlice(), IntervalEnd: b.end})
	}
	return out, nil
}

func (ch elementChange) setElement() (gnft.SetElement, error) {
	key, err := encodeKey(ch.key)
	if err != nil {
		return gnft.SetElement{}, fmt.Errorf("set %s element %q: %w", ch.set, ch.key, err)
	}
	el := gnft.SetElement{Key: key}
	if ch.isMap && !ch.delete {
		chain, ok := strings.CutPrefix(ch.value, "jump ")
		if !ok {
			return el, fmt.Errorf("map %s element %q: unsupported value %q", ch.set, ch.key, ch.value)
		}
		el.VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}
	}
	return el, nil
}

func keyType(typ string) (gnft.SetDatatype, error) {
	switch typ {
	case "ipv4_addr", "ipv4_addr : verdict":
		return gnft.TypeIPAddr, nil
	case "ipv6_addr", "ipv6_addr : verdict":
		return gnft.TypeIP6Addr, nil
	case "ipv4_addr . inet_service":
		return gnft.ConcatSetType(gnft.TypeIPAddr, gnft.TypeInetService)
	case "ipv6_addr . inet_service":
		return gnft.ConcatSetType(gnft.TypeIP6Addr, gnft.TypeInetService)
	}
	return gnft.SetDatatype{}, fmt.Errorf("no netlink encoding for set type %q", typ)
}

// neighborDiscoveryTypes are the ICMPv6 types of ndTypes: router solicitation and
// advertisement, neighbour solicitation and advertisement, redirect.
var neighborDiscoveryTypes = []byte{133, 134, 135, 136, 137}

// neighborDiscoveryExprs are the expressions of ndTypes, whose types are in the anonymous
// set types.
func neighborDiscoveryExprs(types *gnft.Set) []expr.Any {
	e := nftexpr.Family(true)
	e = append(e, nftexpr.L4Proto(unix.IPPROTO_ICMPV6)...)
	return append(e,
		&expr.Payload{DestRegister: nftexpr.Reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Lookup{SourceRegister: nftexpr.Reg1, SetName: types.Name, SetID: types.ID},
		&expr.Verdict{Kind: expr.VerdictAccept})
}

// setHook makes ch the base chain base describes: a filter chain at priority filter, the only
// kind this table has.
func setHook(ch *gnft.Chain, base *knftables.Chain) error {
	if base.Type == nil || *base.Type != knftables.FilterType || base.Priority == nil || *base.Priority != knftables.FilterPriority {
		return fmt.Errorf("no netlink encoding for base chain %+v", base)
	}
	switch *base.Hook {
	case knftables.PreroutingHook:
		ch.Hooknum = gnft.ChainHookPrerouting
	case knftables.ForwardHook:
		ch.Hooknum = gnft.ChainHookForward
	default:
		return fmt.Errorf("no netlink encoding for hook %s", *base.Hook)
	}
	ch.Priority, ch.Type = gnft.ChainPriorityFilter, gnft.ChainTypeFilter
	return nil
}

// exprs compiles the rule into kernel expressions, the same ones nft produces for text(). The
// neighbour discovery rule needs its set first: see neighborDiscoveryExprs.
func (r ruleSpec) exprs() []expr.Any {
	switch {
	case r.vmap != "":
		e := nftexpr.Family(r.v6)
		return append(e, nftexpr.LoadAddr(r.v6, r.peerAddr == "saddr", nftexpr.Reg1),
			&expr.Lookup{SourceRegister: nftexpr.Reg1, SetName: r.vmap, IsDestRegSet: true, DestRegister: 0})
	case r.established:
		return []expr.Any{
			&expr.Ct{Register: nftexpr.Reg1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: nftexpr.Reg1, DestRegister: nftexpr.Reg1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: nftexpr.Reg1, Data: make([]byte, 4)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}
	}
	var e []expr.Any
	if r.proto != "" {
		e = append(e, nftexpr.L4Proto(protoNumber(r.proto))...)
		switch {
		case r.namedSet != "":
			// The port is compared by the named-port lookup below, with the address.
		case r.ports.Last != 0 && r.ports.First == r.ports.Last:
			e = append(e, nftexpr.DPort(r.ports.First)...)
		case r.ports.Last != 0:
			e = append(e, nftexpr.DPortRange(r.ports.First, r.ports.Last)...)
		}
	}
	if r.peerSet != "" {
		e = append(e, nftexpr.Family(r.v6)...)
		e = append(e, nftexpr.LoadAddr(r.v6, r.peerAddr != "daddr", nftexpr.Reg1),
			&expr.Lookup{SourceRegister: nftexpr.Reg1, SetName: r.peerSet})
	}
	if r.namedSet != "" {
		if r.peerSet == "" {
			e = append(e, nftexpr.Family(r.v6)...)
		}
		next := uint32(nftexpr.Reg32_00 + 1)
		if r.v6 {
			next = nftexpr.Reg32_00 + 4
		}
		e = append(e, nftexpr.LoadAddr(r.v6, false, nftexpr.Reg1), nftexpr.LoadDPort(next),
			&expr.Lookup{SourceRegister: nftexpr.Reg1, SetName: r.namedSet})
	}
	if r.counter {
		e = append(e, &expr.Counter{})
	}
	switch {
	case r.log != nil:
		e = append(e,
			&expr.Ct{Register: nftexpr.Reg1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: nftexpr.Reg1, DestRegister: nftexpr.Reg1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: nftexpr.Reg1, Data: make([]byte, 4)},
			&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(r.log.Rate), Unit: expr.LimitTimeSecond, Burst: r.log.Burst},
			&expr.Log{Key: 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_GROUP, Group: r.log.Group, Data: []byte(r.logPrefix)})
	case r.jump != "":
		e = append(e, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.jump})
	case r.gotoTo != "":
		e = append(e, &expr.Verdict{Kind: expr.VerdictGoto, Chain: r.gotoTo})
	case r.drop:
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	default:
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	}
	return e
}

func protoNumber(p policy.Protocol) byte {
	switch p {
	case policy.UDP:
		return unix.IPPROTO_UDP
	case policy.SCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
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
