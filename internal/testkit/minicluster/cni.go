package minicluster

import (
	"fmt"
	"os"
	"os/exec"
)

// UpstreamCNIPlugins are the upstream plugins a node's chain starts with (see cniConfList).
var UpstreamCNIPlugins = []string{
	"github.com/containernetworking/plugins/plugins/main/bridge",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
}

// BuildUpstreamCNI builds UpstreamCNIPlugins into dir, at the version netwarden's go.mod pins,
// static as their releases are. It needs the go command and a checkout (make cni-upstream does
// the same for make cluster-up).
func BuildUpstreamCNI(dir string) error {
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, UpstreamCNIPlugins...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the upstream CNI plugins: %v\n%s", err, out)
	}
	return nil
}
