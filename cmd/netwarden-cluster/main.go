// Command netwarden-cluster runs a Kubernetes cluster of several nodes on this machine, with
// netwarden on every node (internal/testkit/minicluster): `make cluster-up` and
// `make cluster-down`.
//
//	netwarden-cluster up [flags]     start it in the background and wait until it is ready
//	netwarden-cluster serve [flags]  run it in the foreground until SIGINT or SIGTERM
//	netwarden-cluster down           stop the cluster that up started
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/kubeproxy"
	"github.com/netwarden/netwarden/internal/testkit/minicluster"
)

type dirList []string

func (d *dirList) String() string     { return strings.Join(*d, ",") }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	verb := os.Args[1]
	fs := flag.NewFlagSet("netwarden-cluster "+verb, flag.ExitOnError)
	state := fs.String("state", "/run/netwarden-cluster", "directory of the running cluster's pid, log and kubeconfig")
	nodes := fs.Int("nodes", 2, "number of nodes")
	proxyMode := fs.String("proxy-mode", "nftables", "kube-proxy mode: nftables or iptables")
	backend := fs.String("backend", "", "netwarden --backend (empty: deploy/'s default, auto)")
	kubeBin := fs.String("kube-bin-dir", os.Getenv("KUBE_BIN_DIR"), "directory of the binaries hack/kube-binaries.sh builds")
	agent := fs.String("agent", "bin/netwarden", "the netwarden binary")
	deploy := fs.String("deploy", "deploy", "netwarden's deploy/ directory")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long up waits for the cluster to be ready")
	var cniDirs dirList
	fs.Var(&cniDirs, "cni-bin-dir", "directory holding CNI plugins (bridge, host-local, netwarden-portmap, netwarden-gate); repeatable")
	fs.Parse(os.Args[2:])
	if os.Geteuid() != 0 {
		fail(fmt.Errorf("run as root: the cluster's nodes and pods are network namespaces"))
	}
	switch verb {
	case "up":
		fail(minicluster.Up(*state, os.Args[2:], *timeout, os.Stdout))
		fmt.Printf("export KUBECONFIG=%s/%s\n", *state, minicluster.KubeconfigFile)
	case "serve":
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		opts := minicluster.Options{
			Nodes: *nodes, ProxyMode: kubeproxy.Mode(*proxyMode), Backend: *backend, BinDir: *kubeBin,
			AgentBin: abs(*agent), CNIBinDirs: absAll(cniDirs), DeployDir: abs(*deploy), ReadyTimeout: *timeout,
		}
		fail(minicluster.Serve(*state, opts, log))
	case "down":
		fail(minicluster.Down(*state, 2*time.Minute))
	default:
		usage()
	}
}

func abs(p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	wd, _ := os.Getwd()
	return wd + "/" + p
}

func absAll(ps []string) []string {
	var out []string
	for _, p := range ps {
		out = append(out, abs(p))
	}
	return out
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: netwarden-cluster up|serve|down [flags]")
	os.Exit(2)
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "netwarden-cluster:", err)
		os.Exit(1)
	}
}
