// Package gate is the netwarden-gate CNI plugin.
//
// A pod can send and receive from the moment its interface has an address, while the agent
// learns the address only when the API reports Pod.Status.PodIPs, well after. The plugin,
// chained after the plugins that give the pod its addresses, tells the agent the pod's
// namespace, name and addresses over a unix socket (the protocol is internal/gateproto), and
// returns only once the agent has installed that pod's verdicts; until then the agent's guard
// drops every packet of an address in the node's pod CIDRs that it has no verdicts for. So a
// pod is judged from its first packet: a timeout leaves it dropped (fail closed), never open.
package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/netwarden/netwarden/internal/gateproto"
)

// DefaultTimeout bounds how long ADD waits for the agent when the config sets no timeout.
const DefaultTimeout = 10 * time.Second

// delTimeout bounds DEL and GC, which never fail a pod's teardown for a slow agent: the
// agent forgets a pod anyway once its state source drops it.
const delTimeout = 2 * time.Second

// Conf is the plugin's network configuration.
type Conf struct {
	types.PluginConf
	// Socket is the agent's gate socket (its --gate-socket); default gateproto.DefaultSocket.
	Socket string `json:"socket,omitempty"`
	// Timeout is how long ADD waits for the agent to install the pod's verdicts, as a Go
	// duration ("5s", "500ms"); default DefaultTimeout.
	Timeout string `json:"timeout,omitempty"`
	// OldAttachments is the key the spec first used for GC's valid attachments.
	OldAttachments []types.GCAttachment `json:"cni.dev/attachments,omitempty"`

	timeout time.Duration
	prev    *current.Result
}

func configError(field, format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, field+": "+fmt.Sprintf(format, a...), "")
}

// ParseConf decodes and checks the config; errors name the field.
func ParseConf(stdin []byte) (*Conf, error) {
	conf := &Conf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "network configuration: "+err.Error(), "")
	}
	if conf.Socket == "" {
		conf.Socket = gateproto.DefaultSocket
	} else if !strings.HasPrefix(conf.Socket, "/") {
		return nil, configError("socket", "%q: want an absolute path", conf.Socket)
	}
	conf.timeout = DefaultTimeout
	if conf.Timeout != "" {
		d, err := time.ParseDuration(conf.Timeout)
		if err != nil || d <= 0 {
			return nil, configError("timeout", "%q: want a positive duration such as \"5s\"", conf.Timeout)
		}
		conf.timeout = d
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, configError("prevResult", "%v", err)
		}
		res, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return nil, configError("prevResult", "%v", err)
		}
		conf.prev = res
	}
	return conf, nil
}

// podArgs reads K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS ("K=V;K=V").
func podArgs(args string) (namespace, name string, err error) {
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			namespace = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	for _, m := range []struct{ key, val string }{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}} {
		if m.val == "" {
			return "", "", types.NewError(types.ErrInvalidEnvironmentVariables,
				"CNI_ARGS "+m.key+": missing; netwarden-gate needs the pod's namespace and name, which the kubelet passes", "")
		}
	}
	return namespace, name, nil
}

// attachmentIPs returns the addresses prevResult gave the container's interface.
func (c *Conf) attachmentIPs() ([]string, error) {
	if c.prev == nil {
		return nil, configError("prevResult", "missing: chain netwarden-gate after the plugins that give the pod its addresses")
	}
	var ips []string
	for _, ipc := range c.prev.IPs {
		ips = append(ips, ipc.Address.IP.String())
	}
	if len(ips) == 0 {
		return nil, configError("prevResult", "no IPs: chain netwarden-gate after the plugins that give the pod its addresses")
	}
	return ips, nil
}

func attachment(args *skel.CmdArgs) gateproto.Attachment {
	return gateproto.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
}

func agentError(err error) *types.Error {
	return types.NewError(types.ErrTryAgainLater, err.Error(), "")
}

func add(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	ns, name, err := podArgs(args.Args)
	if err != nil {
		return err
	}
	ips, err := conf.attachmentIPs()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	resp, err := gateproto.Call(ctx, conf.Socket, gateproto.Request{Verb: gateproto.VerbAdd, Attachment: attachment(args),
		Namespace: ns, Name: name, IPs: ips})
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return agentError(fmt.Errorf("pod %s/%s: the netwarden agent did not install its verdicts within %v (timeout); its traffic stays dropped", ns, name, conf.timeout))
	case err != nil:
		return agentError(fmt.Errorf("pod %s/%s: %w; its traffic stays dropped", ns, name, err))
	case resp.Error != "":
		return agentError(fmt.Errorf("pod %s/%s: netwarden agent: %s; its traffic stays dropped", ns, name, resp.Error))
	}
	return types.PrintResult(conf.prev, conf.CNIVersion)
}

func del(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(conf.timeout, delTimeout))
	defer cancel()
	// An agent that is down or slow has nothing to undo that it will not undo itself, and DEL
	// must not keep a pod from being torn down.
	_, _ = gateproto.Call(ctx, conf.Socket, gateproto.Request{Verb: gateproto.VerbDel, Attachment: attachment(args)})
	return nil
}

func check(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	ns, name, err := podArgs(args.Args)
	if err != nil {
		return err
	}
	ips, err := conf.attachmentIPs()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	resp, err := gateproto.Call(ctx, conf.Socket, gateproto.Request{Verb: gateproto.VerbCheck, Attachment: attachment(args),
		Namespace: ns, Name: name, IPs: ips})
	if err != nil {
		return agentError(fmt.Errorf("pod %s/%s: %w", ns, name, err))
	}
	if resp.Error != "" {
		return types.NewError(types.ErrInternal, fmt.Sprintf("pod %s/%s: %s", ns, name, resp.Error), "")
	}
	return nil
}

func gc(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	var valid []gateproto.Attachment
	for _, list := range [][]types.GCAttachment{conf.ValidAttachments, conf.OldAttachments} {
		for _, a := range list {
			valid = append(valid, gateproto.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(conf.timeout, delTimeout))
	defer cancel()
	resp, err := gateproto.Call(ctx, conf.Socket, gateproto.Request{Verb: gateproto.VerbGC, Valid: valid})
	if err != nil {
		return agentError(err)
	}
	if resp.Error != "" {
		return types.NewError(types.ErrInternal, resp.Error, "")
	}
	return nil
}

func status(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(conf.timeout, delTimeout))
	defer cancel()
	resp, err := gateproto.Call(ctx, conf.Socket, gateproto.Request{Verb: gateproto.VerbStatus})
	if err == nil && resp.Error != "" {
		err = errors.New(resp.Error)
	}
	if err != nil {
		// The runtime holds new pods back while a plugin is not available.
		return types.NewError(types.ErrPluginNotAvailable, "netwarden agent not ready to admit pods: "+err.Error(), "")
	}
	return nil
}

// Main runs the plugin as a CNI executable.
func Main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: check, GC: gc, Status: status},
		version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		"netwarden-gate: holds a pod's start until the netwarden agent judges its traffic")
}
