package cli

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/netwarden/netwarden/internal/agent"
	"github.com/netwarden/netwarden/internal/backendchoice"
	"github.com/netwarden/netwarden/internal/gateproto"
)

// guardFlags choose what happens to established flows a policy change denies.
type guardFlags struct {
	keepEstablished bool
	denyMark        string
	gateSocket      string
}

func (f *guardFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&f.keepEstablished, "keep-established", false,
		"let flows that were established before a policy change denied them go on (Calico's behaviour); by default they are stopped")
	fs.StringVar(&f.denyMark, "conntrack-deny-mark", fmt.Sprintf("0x%x", agent.DefaultDenyMark),
		"the conntrack mark bit(s) that flag an established flow a policy now denies; no other component may use them")
	fs.StringVar(&f.gateSocket, "gate-socket", "",
		"serve the netwarden-gate CNI plugin on this unix socket (such as "+gateproto.DefaultSocket+"): a pod starts once its verdicts are installed, "+
			"and traffic of addresses in this node's podCIDRs that the agent has no verdicts for is dropped; empty disables")
}

// check rejects flags that would be ignored.
func (f *guardFlags) check(networkPolicy bool) error {
	if f.gateSocket != "" && !networkPolicy {
		return fmt.Errorf("--gate-socket needs --network-policy: the gate waits for a pod's NetworkPolicy verdicts")
	}
	return nil
}

// apply sets the guard of the NetworkPolicy feature, whose backend is of kind k.
func (f *guardFlags) apply(np *agent.NetworkPolicy, k backendchoice.Kind) error {
	mark, err := strconv.ParseUint(f.denyMark, 0, 32)
	if err != nil || mark == 0 {
		return fmt.Errorf("--conntrack-deny-mark %q: want a non-zero 32-bit mask such as 0x%x", f.denyMark, agent.DefaultDenyMark)
	}
	if !f.keepEstablished {
		np.DenyMark = uint32(mark)
	}
	if f.gateSocket != "" && !filepath.IsAbs(f.gateSocket) {
		return fmt.Errorf("--gate-socket %q: want an absolute path", f.gateSocket)
	}
	np.GateSocket = f.gateSocket
	np.Guard = kinds[k].guard()
	return nil
}
