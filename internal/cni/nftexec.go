package cni

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/netwarden/netwarden/internal/kernel/command"
	"github.com/netwarden/netwarden/internal/kernel/nftjson"
)

// nftExec runs nft for one inet table. It builds transactions with knftables but runs them
// itself: knftables.New probes nft with two extra processes, which would be most of the cost
// of a steady-state ADD; the probe runs once, when the table is created (see NFTStore.setup).
type nftExec struct {
	table string
	tmpl  *knftables.Fake
}

var (
	errNFTNotFound = errors.New("no such object")
	errNFTExists   = errors.New("object exists")
)

func newNFTExec(table string) *nftExec {
	return &nftExec{table: table, tmpl: knftables.NewFake(knftables.InetFamily, table)}
}

func (e *nftExec) tx() *knftables.Transaction { return e.tmpl.NewTransaction() }

func (e *nftExec) nft(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	var in []byte
	if stdin != "" {
		in = []byte(stdin)
	}
	out, err := command.Run(ctx, in, "nft", args...)
	switch {
	case err == nil:
		return out, nil
	case strings.Contains(err.Error(), "No such file or directory"):
		return nil, fmt.Errorf("%w (%w)", err, errNFTNotFound)
	case strings.Contains(err.Error(), "File exists"):
		return nil, fmt.Errorf("%w (%w)", err, errNFTExists)
	}
	return nil, err
}

// run applies tx as one nft transaction.
func (e *nftExec) run(ctx context.Context, tx *knftables.Transaction) error {
	_, err := e.nft(ctx, tx.String(), "-f", "-")
	return err
}

type nftRule struct {
	Chain   string
	Handle  int
	Comment string
}

// listChains lists the chain names of the table.
func (e *nftExec) listChains(ctx context.Context) ([]string, error) {
	out, err := e.nft(ctx, "", "-j", "list", "chains", "inet")
	if err != nil {
		return nil, err
	}
	l, err := nftjson.Parse(out)
	if err != nil {
		return nil, fmt.Errorf("nft -j list chains: %w", err)
	}
	names := l.Chains(e.table)
	return names, nil
}

// chainText returns the rules of one chain as nft prints them, one per line.
func (e *nftExec) chainText(ctx context.Context, name string) ([]string, error) {
	out, err := e.nft(ctx, "", "list", "chain", "inet", e.table, name)
	if errors.Is(err, errNFTNotFound) {
		return nil, fmt.Errorf("chain %s does not exist: %w", name, errNFTNotFound)
	}
	if err != nil {
		return nil, err
	}
	var rules []string
	depth := 0
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasSuffix(line, "{"):
			depth++
		case line == "}":
			depth--
		case depth == 2 && line != "" && !strings.HasPrefix(line, "type "):
			rules = append(rules, line)
		}
	}
	return rules, nil
}
