package cli

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netwarden/netwarden/internal/agent"
	"github.com/netwarden/netwarden/internal/domains"
	"github.com/netwarden/netwarden/internal/lint"
)

// domainFlags configure the learning of domainNames peers' addresses.
type domainFlags struct {
	servers          []string
	namespace, label string
	grace, history   time.Duration
	queue            uint16
}

func (d *domainFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringSliceVar(&d.servers, "dns-servers", nil,
		"the DNS servers whose answers teach the addresses of ClusterNetworkPolicy domainNames peers (IPs); default: the pods selected by --dns-namespace and --dns-labels")
	fs.StringVar(&d.namespace, "dns-namespace", lint.DefaultOptions.DNSNamespace, "the namespace of the cluster DNS pods")
	fs.StringVar(&d.label, "dns-labels", labels.SelectorFromSet(lint.DefaultOptions.DNSLabels).String(), "the labels of the cluster DNS pods")
	fs.DurationVar(&d.grace, "dns-grace", 30*time.Second, "how long past its TTL an address learned for a domainNames peer stays admitted")
	fs.DurationVar(&d.history, "dns-history", 24*time.Hour,
		"how long after it expired an address learned for a domainNames peer still counts for the established flows it admitted")
	fs.Uint16Var(&d.queue, "dns-queue", 53, "the NFQUEUE number the cluster DNS's replies are held on while their addresses are written")
}

func (d *domainFlags) config() (*agent.DomainNames, error) {
	if d.grace < 0 {
		return nil, fmt.Errorf("--dns-grace must not be negative, got %v", d.grace)
	}
	if d.history < 0 {
		return nil, fmt.Errorf("--dns-history must not be negative, got %v", d.history)
	}
	sel, err := labels.ConvertSelectorToLabelsMap(d.label)
	if err != nil || len(sel) == 0 {
		return nil, fmt.Errorf("--dns-labels %q: want KEY=VALUE[,KEY=VALUE...]", d.label)
	}
	cfg := &agent.DomainNames{
		Config:          domains.Config{Queue: d.queue, Grace: d.grace, History: d.history},
		ServerNamespace: d.namespace, ServerLabels: labels.SelectorFromSet(sel),
	}
	for _, s := range d.servers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("--dns-servers: %q is not an IP address", s)
		}
		cfg.Servers = append(cfg.Servers, a.Unmap())
	}
	return cfg, nil
}
