package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/netwarden/netwarden/internal/backendchoice"
)

// Timeout bounds one invocation; the lock wait is part of it.
const Timeout = 60 * time.Second

// NetConf is the part of the stdin config that both plugins read.
type NetConf struct {
	types.PluginConf
	// Backend is "nftables", "iptables" (iptables-nft, else legacy), "iptables-nft",
	// "iptables-legacy", or empty for the agent's choice: nftables when nft works, else iptables.
	Backend string `json:"backend,omitempty"`
	// OldAttachments is the key the spec first used for GC's valid attachments; libcni sends both.
	OldAttachments []types.GCAttachment `json:"cni.dev/attachments,omitempty"`
}

// Invocation is one call of a plugin.
type Invocation struct {
	Command string
	Args    *skel.CmdArgs
	Conf    NetConf
	// Result is the prevResult converted to the current version; nil if there was none.
	Result *current.Result
	Att    Attachment

	// releases run when the verb is done, after the plugin's lock is let go.
	releases []func()
}

// ReleaseWhenDone has release run when the verb is done and the plugin's lock is let go: for
// kernel sockets that are released rather than closed (nftnl.Conn.Release), which on kernels
// before 6.9 still wait for the kernel's deferred free, a wait that must not hold the lock.
func (inv *Invocation) ReleaseWhenDone(release func()) {
	inv.releases = append(inv.releases, release)
}

// Plugin is what a meta plugin supplies to Main.
type Plugin interface {
	// Name is the binary name, used for the lock and in messages.
	Name() string
	NFTLayout() NFTLayout
	IPTLayout() IPTLayout
	// Desired parses the plugin's own config fields from inv.Args.StdinData and returns the
	// attachment's rules for the backend kind ("nftables" or "iptables"). Errors are *types.Error
	// naming the field.
	Desired(inv *Invocation, kind string) (Desired, error)
	// AfterAdd and AfterDel run after the rules changed (conntrack flushes, sysctls); d is nil
	// when DEL could not compute the rules.
	AfterAdd(inv *Invocation, d *Desired) error
	AfterDel(inv *Invocation, d *Desired) error
}

// Main runs a plugin as a CNI executable.
func Main(p Plugin) {
	run := func(cmd string) func(*skel.CmdArgs) error {
		return func(args *skel.CmdArgs) error { return Invoke(p, cmd, args) }
	}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: run("ADD"), Del: run("DEL"), Check: run("CHECK"), GC: run("GC"), Status: run("STATUS"),
	}, version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), p.Name()+": netwarden CNI meta plugin")
}

// ConfigError is a CNI error result for invalid network configuration, naming the field.
func ConfigError(field, format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, field+": "+fmt.Sprintf(format, a...), "")
}

func internalError(err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// ParseConf decodes the common config and the prevResult.
func ParseConf(stdin []byte) (NetConf, *current.Result, error) {
	var conf NetConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return conf, nil, types.NewError(types.ErrDecodingFailure, "network configuration: "+err.Error(), "")
	}
	switch conf.Backend {
	case "", "nftables", "iptables", "iptables-nft", "iptables-legacy":
	default:
		return conf, nil, ConfigError("backend", "%q: want nftables, iptables, iptables-nft or iptables-legacy", conf.Backend)
	}
	if conf.RawPrevResult == nil {
		return conf, nil, nil
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return conf, nil, ConfigError("prevResult", "%v", err)
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return conf, nil, ConfigError("prevResult", "%v", err)
	}
	return conf, res, nil
}

// OpenStore returns the store for the configured backend. A named kind is opened without a
// probe unless probe is set (STATUS always probes); "iptables" and an empty backend are chosen
// as the agent chooses (backendchoice), and the automatic choice is remembered for this network
// namespace so that later invocations do not pay for the probe.
func OpenStore(ctx context.Context, p Plugin, backend string, probe bool) (store Store, kind string, err error) {
	unavailable := func(err error) error { return types.NewError(types.ErrPluginNotAvailable, err.Error(), "") }
	requested := backendchoice.Kind(backend)
	switch requested {
	case backendchoice.NFTables:
		if !probe {
			return newNFTStoreUnchecked(p.NFTLayout()), "nftables", nil
		}
	case backendchoice.IPTablesNFT, backendchoice.IPTablesLegacy:
		if !probe {
			mode, _ := requested.IPTablesMode()
			return newIPTStoreUnchecked(p.IPTLayout(), mode), "iptables", nil
		}
	}
	cache := ""
	if backend == "" {
		cache = choiceFile(p.Name())
	}
	if !probe && cache != "" {
		if b, err := os.ReadFile(cache); err == nil {
			if chosen := strings.TrimSpace(string(b)); chosen != "" {
				return OpenStore(ctx, p, chosen, false)
			}
		}
	}
	store, chosen, err := backendchoice.Open(ctx, backend, func(ctx context.Context, k backendchoice.Kind) (Store, error) {
		if mode, ok := k.IPTablesMode(); ok {
			return NewIPTStore(ctx, p.IPTLayout(), string(mode))
		}
		return NewNFTStore(p.NFTLayout())
	})
	if err != nil {
		what := "backend " + backend
		if backend == "" {
			what = "no usable backend"
		}
		return nil, "", unavailable(fmt.Errorf("%s: %w", what, err))
	}
	if cache != "" {
		_ = os.WriteFile(cache, []byte(string(chosen)+"\n"), 0o644)
	}
	kind = "nftables"
	if _, ok := chosen.IPTablesMode(); ok {
		kind = "iptables"
	}
	return store, kind, nil
}

// choiceFile is where the automatic backend choice for this network namespace is remembered,
// or "" if the namespace cannot be identified.
func choiceFile(plugin string) string {
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return filepath.Join(lockDir(), fmt.Sprintf("%s.backend.%d-%d", plugin, st.Dev, st.Ino))
}

// Invoke runs one verb.
func Invoke(p Plugin, cmd string, args *skel.CmdArgs) error {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	conf, res, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	inv := &Invocation{Command: cmd, Args: args, Conf: conf, Result: res,
		Att: Attachment{Network: conf.Name, IfName: args.IfName, ContainerID: args.ContainerID}}
	if (cmd == "ADD" || cmd == "CHECK") && res == nil {
		return ConfigError("prevResult", "missing: %s must be chained after a plugin that sets up the interface and its IPs", p.Name())
	}
	if cmd != "STATUS" && conf.Name == "" {
		return ConfigError("name", "missing network name")
	}
	unlock, err := Lock(ctx, p.Name())
	if errors.Is(err, ErrLockTimeout) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	if err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	defer func() {
		unlock()
		for _, release := range inv.releases {
			release()
		}
	}()
	store, kind, err := OpenStore(ctx, p, conf.Backend, cmd == "STATUS")
	if err != nil {
		return err
	}
	inv.ReleaseWhenDone(store.Release)
	switch cmd {
	case "ADD":
		d, err := p.Desired(inv, kind)
		if err != nil {
			return err
		}
		if err := store.Add(ctx, d); err != nil {
			return internalError(err)
		}
		if err := p.AfterAdd(inv, &d); err != nil {
			return internalError(err)
		}
		return types.PrintResult(res, conf.CNIVersion)
	case "DEL":
		if err := store.Del(ctx, inv.Att); err != nil {
			return internalError(err)
		}
		// DEL succeeds even when the config no longer yields rules; it then has none to flush for.
		var dp *Desired
		if d, err := p.Desired(inv, kind); err == nil {
			dp = &d
		}
		if err := p.AfterDel(inv, dp); err != nil {
			fmt.Fprintf(os.Stderr, "%s: DEL %s: %v\n", p.Name(), inv.Att, err)
		}
		return nil
	case "CHECK":
		d, err := p.Desired(inv, kind)
		if err != nil {
			return err
		}
		if err := store.Check(ctx, d); err != nil {
			return internalError(fmt.Errorf("CHECK %s (%s): %w", inv.Att, store.Backend(), err))
		}
		return nil
	case "GC":
		valid := map[string]bool{}
		for _, list := range [][]types.GCAttachment{conf.ValidAttachments, conf.OldAttachments} {
			for _, a := range list {
				valid[Attachment{Network: conf.Name, IfName: a.IfName, ContainerID: a.ContainerID}.ID()] = true
			}
		}
		if err := store.GC(ctx, conf.Name, valid); err != nil {
			return internalError(err)
		}
		return nil
	case "STATUS":
		if err := store.Status(ctx); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, store.Backend()+": "+err.Error(), "")
		}
		return nil
	}
	return types.NewError(types.ErrInvalidEnvironmentVariables, "unknown CNI_COMMAND "+cmd, "")
}
