package minicluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/netwarden/netwarden/internal/testkit/kubetest"
)

// component is a control-plane process of the cluster, its output kept for the failure report.
type component struct {
	name string
	proc *kubetest.Process
	logs *kubetest.LogBuffer
}

func (c *component) stop() {
	if c.proc != nil {
		c.proc.Stop(10 * time.Second)
		c.proc = nil
	}
}

func (c *component) exited() error {
	if c.proc == nil {
		return fmt.Errorf("%s is not running", c.name)
	}
	if done, err := c.proc.Exited(); done {
		return fmt.Errorf("%s exited (%v); its log:\n%s", c.name, err, tail(c.logs.String(), 4000))
	}
	return nil
}

func startComponent(name, bin string, args []string) (*component, error) {
	logs := kubetest.NewLogBuffer(name)
	p, err := kubetest.StartProcess(bin, args, nil, logs)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &component{name: name, proc: p, logs: logs}, nil
}

// startControllerManager runs kube-controller-manager with every default controller: the
// suites need Deployments, StatefulSets and ReplicaSets, EndpointSlices, namespace deletion,
// service accounts and garbage collection. Node CIDRs are not allocated by it: each node comes
// with its own (see nodePodCIDR), as the node daemon registers it.
func startControllerManager(binDir, kubeconfig string, srv *kubetest.Server) (*component, error) {
	// The root CA it publishes in every namespace (kube-root-ca.crt) is the one that verifies
	// the API server.
	caFile := filepath.Join(srv.Dir, "ca.crt")
	if err := os.WriteFile(caFile, srv.CACert, 0o644); err != nil {
		return nil, err
	}
	return startComponent("kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--controllers=*",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + filepath.Join(srv.Dir, "sa.key"),
		"--root-ca-file=" + caFile,
		"--cluster-cidr=" + ClusterCIDR.String(),
		"--allocate-node-cidrs=false",
		"--service-cluster-ip-range=" + kubetest.ServiceClusterIPRange,
		// Pods of a node that stopped answering go soon, not after 5 minutes: a test that
		// stops a node wants its pods rescheduled within its own time.
		"--node-monitor-grace-period=20s",
		"--concurrent-statefulset-syncs=10",
		"--profiling=false",
		"--v=1",
	})
}

func startScheduler(binDir, kubeconfig string) (*component, error) {
	return startComponent("kube-scheduler", filepath.Join(binDir, "kube-scheduler"), []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(freePort()),
		"--profiling=false",
		"--v=1",
	})
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
