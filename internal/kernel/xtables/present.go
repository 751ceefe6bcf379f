package xtables

import (
	"bufio"
	"errors"
	"io/fs"
	"os"

	gnft "github.com/google/nftables"
)

// TablePresent reports whether table of family fam exists in the kernel for this variant, in
// this network namespace, without running a command: legacy tables are listed in
// /proc/net/ip{,6}_tables_names once instantiated (the kernel makes them in a namespace when
// first used there), iptables-nft's are nftables tables of family
// ip or ip6. A table that is not there holds no rules of ours, so clean-up (which otherwise runs
// a save per table, family and variant: some 150 ms of an agent's start) can pass it by. Any
// doubt (an unreadable list) answers true.
func TablePresent(mode Mode, fam Family, table string) bool {
	if mode == ModeLegacy {
		// thread-self: the namespace of this thread, which a test (or a caller switching
		// namespaces) may have moved alone; /proc/net is the process's.
		path := "/proc/thread-self/net/ip_tables_names"
		if fam == IPv6 {
			path = "/proc/thread-self/net/ip6_tables_names"
		}
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return false // no legacy tables module loaded, so no legacy table anywhere
		}
		if err != nil {
			return true
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if sc.Text() == table {
				return true
			}
		}
		return sc.Err() != nil
	}
	conn, err := gnft.New()
	if err != nil {
		return true
	}
	family := gnft.TableFamilyIPv4
	if fam == IPv6 {
		family = gnft.TableFamilyIPv6
	}
	tables, err := conn.ListTablesOfFamily(family)
	if err != nil {
		return true
	}
	for _, t := range tables {
		if t.Name == table {
			return true
		}
	}
	return false
}

// AnyTablePresent reports whether table exists in either family for this variant.
func AnyTablePresent(mode Mode, table string) bool {
	return TablePresent(mode, IPv4, table) || TablePresent(mode, IPv6, table)
}
