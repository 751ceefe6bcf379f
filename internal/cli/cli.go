// Package cli wires flags to the agent, render, cleanup and version commands.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/agent"
	"github.com/netwarden/netwarden/internal/backendchoice"
	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/source/kubeapi"
	"github.com/netwarden/netwarden/internal/source/manifests"
)

// Version is set at build time with -ldflags "-X github.com/netwarden/netwarden/internal/cli.Version=...".
var Version = "dev"

// stateFlags select where cluster state comes from and which node it is compiled for.
type stateFlags struct {
	nodeName      string
	kubeconfig    string
	manifests     string
	backend       string
	networkPolicy bool
	logLevel      string
}

func (f *stateFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.nodeName, "node-name", "", "this node's name (default $NODE_NAME, then the hostname)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API; in-cluster config when empty and KUBERNETES_SERVICE_HOST is set")
	fs.StringVar(&f.manifests, "manifests", "", "read cluster state from the manifests in this directory instead of the API")
	fs.StringVar(&f.backend, "backend", "auto", "kernel backend: auto, nftables or iptables")
	fs.BoolVar(&f.networkPolicy, "network-policy", true, "enforce NetworkPolicy")
	fs.StringVar(&f.logLevel, "log-level", "info", "log verbosity: debug, info, warn or error")
}

func (f *stateFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), nil
}

func (f *stateFlags) resolveNodeName() (string, error) {
	if f.nodeName != "" {
		return f.nodeName, nil
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("--node-name not set, $NODE_NAME empty, and hostname unavailable: %w", err)
	}
	return strings.ToLower(h), nil
}

// source returns the source of cluster state the flags select. writeStatus lets it write status
// conditions (the agent's ClusterNetworkPolicy condition); a one-off read writes nothing.
func (f *stateFlags) source(log *slog.Logger, writeStatus bool) (cluster.Source, error) {
	if f.manifests != "" && f.kubeconfig != "" {
		return nil, errors.New("--manifests and --kubeconfig are mutually exclusive")
	}
	if f.manifests != "" {
		st, err := os.Stat(f.manifests)
		if err != nil {
			return nil, fmt.Errorf("--manifests: %w", err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("--manifests %s: not a directory", f.manifests)
		}
		return manifests.New(f.manifests, log), nil
	}
	var cfg *rest.Config
	var err error
	switch {
	case f.kubeconfig != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", f.kubeconfig, err)
		}
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
	default:
		return nil, errors.New("no cluster state: pass --manifests DIR or --kubeconfig PATH (or run in a cluster)")
	}
	cfg.UserAgent = "netwarden/" + Version
	// The built-in kinds in protobuf: a pod's watch event is about half the bytes of its JSON
	// and decodes several times faster, which is most of what a node agent of a large cluster
	// receives. ClusterNetworkPolicy is a custom resource, served only as JSON.
	core := rest.CopyConfig(cfg)
	core.ContentType = "application/vnd.kubernetes.protobuf"
	core.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(core)
	if err != nil {
		return nil, err
	}
	npa, err := npaclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	opts := []kubeapi.Option{kubeapi.WithClusterNetworkPolicies(npa)}
	if writeStatus {
		opts = append(opts, kubeapi.WithClusterPolicyStatus())
	}
	return kubeapi.New(client, log, opts...), nil
}

// loadState reads the cluster state once: the manifests directory as it is (any problem is an
// error), or the API once its caches have synced.
func (f *stateFlags) loadState(ctx context.Context, log *slog.Logger) (*cluster.State, error) {
	if f.manifests != "" && f.kubeconfig == "" {
		st, errs := manifests.Load(f.manifests, log)
		if len(errs) > 0 {
			return nil, fmt.Errorf("%d problem(s) in %s:\n  %w", len(errs), f.manifests, errors.Join(errs...))
		}
		return st, nil
	}
	src, err := f.source(log, false)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	go func() { _ = src.Run(ctx, func() {}) }()
	for !src.HasSynced() {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for cluster state: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return src.Snapshot(), nil
}

// Main runs the command line and returns the process exit code.
func Main(args []string) int {
	root := &cobra.Command{
		Use:           "netwarden",
		Short:         "Node network agent: NetworkPolicy and masquerade enforced in the kernel",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(agentCmd(), renderCmd(), explainCmd(), lintCmd(), cleanupCmd(), versionCmd())
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "netwarden:", err)
		return 1
	}
	return 0
}

func agentCmd() *cobra.Command {
	var f stateFlags
	var mf masqFlags
	var gf guardFlags
	var once bool
	var healthAddr string
	var profiling bool
	var cpuProfile string
	var resync, compactDelay time.Duration
	var df dropFlags
	var dnf domainFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Watch the cluster and keep this node's kernel enforcing it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := f.logger(os.Stderr)
			if err != nil {
				return err
			}
			node, err := f.resolveNodeName()
			if err != nil {
				return err
			}
			src, err := f.source(log, true)
			if err != nil {
				return err
			}
			if compactDelay <= 0 {
				return fmt.Errorf("--compact-delay must be positive, got %v", compactDelay)
			}
			if err := gf.check(f.networkPolicy); err != nil {
				return err
			}
			cfg := agent.Config{NodeName: node, Source: src, HealthAddr: healthAddr, Profiling: profiling, Logger: log}
			np := &agent.NetworkPolicy{ResyncPeriod: resync, CompactDelay: compactDelay}
			if np.DropLog, err = df.config(f.networkPolicy); err != nil {
				return err
			}
			if np.StagedLog, err = df.stagedConfig(f.networkPolicy); err != nil {
				return err
			}
			if np.Domains, err = dnf.config(); err != nil {
				return err
			}
			if cpuProfile != "" {
				stopProfile, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// The flags are checked; what follows probes the kernel's tools while the source loads.
			cfg.Source = agent.StartEarly(ctx, src)
			if f.networkPolicy {
				var kind backendchoice.Kind
				np.Backend, kind, err = openBackend(cmd.Context(), f.backend, func(kb kindBackends) func(context.Context) (policy.Backend, error) { return kb.policy })
				if err != nil {
					return err
				}
				log.Info("backend selected", "backend", np.Backend.Name(), "requested", f.backend)
				if df.counters {
					if _, ok := np.Backend.(policy.PolicyCounters); !ok {
						return fmt.Errorf("--policy-counters: the %s backend has no per-policy counters (nftables has)", np.Backend.Name())
					}
					np.Counters = true
				}
				if err := gf.apply(np, kind); err != nil {
					return err
				}
				np.RetireOthers = retireOthers(kind, networkPolicyRules, guardRules)
				cfg.NetworkPolicy = np
			} else if err := cleanup(cmd.Context(), networkPolicyRules, guardRules); err != nil {
				// Turning the feature off must not leave old rules enforcing.
				return err
			}
			if cfg.Masquerade, err = mf.config(cmd.Context(), f.backend, log); err != nil {
				return err
			}
			if !mf.enabled {
				if err := cleanup(cmd.Context(), masqueradeRules); err != nil {
					return err
				}
			}
			a := agent.New(cfg)
			if once {
				return a.Once(ctx)
			}
			return a.Run(ctx)
		},
	}
	f.register(cmd)
	mf.register(cmd)
	df.register(cmd)
	gf.register(cmd)
	dnf.register(cmd)
	cmd.Flags().BoolVar(&once, "once", false, "sync once; exit 0 when the kernel holds the desired state, non-zero otherwise")
	cmd.Flags().StringVar(&healthAddr, "health-addr", "127.0.0.1:9491", "serve /healthz, /readyz, /status (what the kernel holds, as JSON) and /metrics on HOST:PORT or unix:PATH (empty disables)")
	cmd.Flags().BoolVar(&profiling, "profiling", false, "serve Go's CPU, heap and goroutine profiles under /debug/pprof/ on --health-addr")
	cmd.Flags().StringVar(&cpuProfile, "cpu-profile", "", "write Go's CPU profile of the whole run to this file (for --once, where --profiling has no time to be asked)")
	cmd.Flags().DurationVar(&resync, "resync-period", 30*time.Second, "how often to check the kernel for drift and repair it")
	cmd.Flags().DurationVar(&compactDelay, "compact-delay", time.Second,
		"how long the rules must be quiet before removals that changes deferred are applied (iptables-nft, where a removal costs far more than an addition)")
	return cmd
}

func renderCmd() *cobra.Command {
	var f stateFlags
	var mf masqFlags
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the complete ruleset the agent would apply; touch nothing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := f.logger(os.Stderr)
			if err != nil {
				return err
			}
			node, err := f.resolveNodeName()
			if err != nil {
				return err
			}
			st, err := f.loadState(cmd.Context(), log)
			if err != nil {
				return err
			}
			if f.networkPolicy {
				rs, _ := policy.Compile(st, node)
				text, err := renderPolicy(cmd.Context(), f.backend, rs)
				if err != nil {
					return err
				}
				fmt.Fprint(cmd.OutOrStdout(), text)
			}
			if mf.enabled {
				text, err := mf.render(cmd.Context(), f.backend, st, node)
				if err != nil {
					return err
				}
				fmt.Fprint(cmd.OutOrStdout(), text)
			}
			return nil
		},
	}
	f.register(cmd)
	mf.register(cmd)
	return cmd
}

func cleanupCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything netwarden installed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cleanup(cmd.Context(), networkPolicyRules, guardRules, masqueradeRules)
		},
	}
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "netwarden", Version) },
	}
}

// startCPUProfile profiles the process into path until the returned function is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
