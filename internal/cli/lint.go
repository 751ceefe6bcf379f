package cli

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/lint"
	"github.com/netwarden/netwarden/internal/source/manifests"
)

func lintCmd() *cobra.Command {
	var f stateFlags
	var output, dnsNamespace, dnsLabels string
	cmd := &cobra.Command{
		Use:   "lint [--manifests DIR | --kubeconfig PATH] [-o text|json]",
		Short: "Find the NetworkPolicy and ClusterNetworkPolicy mistakes that break clusters",
		Long: `Lint judges the cluster's policies with the model the agent programs and reports, for each
mistake, the object and the rule, why it matters and what to change:

  dns-egress          pods isolated for egress (or denied by a ClusterNetworkPolicy) that cannot
                      reach the cluster DNS pods on UDP port 53 (error)
  selects-nothing     policies, subjects and peers that match no pod (or node) today (warning)
  named-port          named ports that no pod they apply to has (warning)
  ipblock-except      ipBlock excepts outside their cidr (error)
  unreachable-rule    ClusterNetworkPolicy rules an earlier rule of the same or an earlier policy
                      of the tier always decides first (warning)
  deny-nodes          Deny rules over the nodes' addresses (warning)
  priority-collision  policies of one tier and priority that select the same pods (warning)
  backend-skips       policies a backend cannot express, which the agent applies fail-closed (error)
  invalid             objects the agent refuses (a manifest that does not load), with where (error)

It exits non-zero when it finds an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("-o %q: want text or json", output)
			}
			sel, err := labels.ConvertSelectorToLabelsMap(dnsLabels)
			if err != nil || len(sel) == 0 {
				return fmt.Errorf("--dns-labels %q: want KEY=VALUE[,KEY=VALUE...]", dnsLabels)
			}
			log, err := f.logger(os.Stderr)
			if err != nil {
				return err
			}
			var st *cluster.State
			var invalid []error
			if f.manifests != "" && f.kubeconfig == "" {
				// Every problem at once: the objects that load are linted beside those that do not.
				st, invalid = manifests.Load(f.manifests, log)
			} else if st, err = f.loadState(cmd.Context(), log); err != nil {
				return err
			}
			r := lint.Run(st, lint.Options{DNSNamespace: dnsNamespace, DNSLabels: sel})
			r.AddInvalid(invalid)
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(r); err != nil {
					return err
				}
			} else {
				for _, f := range r.Findings {
					fmt.Fprintln(out, f)
				}
				for _, n := range r.Notes {
					fmt.Fprintln(out, "note:", n)
				}
				fmt.Fprintf(out, "%d errors, %d warnings\n", r.Errors(), len(r.Findings)-r.Errors())
			}
			if n := r.Errors(); n > 0 {
				return fmt.Errorf("%d errors found", n)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&output, "output", "o", "text", "text or json")
	fs.StringVar(&dnsNamespace, "dns-namespace", lint.DefaultOptions.DNSNamespace, "the namespace of the cluster DNS pods")
	fs.StringVar(&dnsLabels, "dns-labels", labels.SelectorFromSet(lint.DefaultOptions.DNSLabels).String(), "the labels of the cluster DNS pods")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API; in-cluster config when empty and KUBERNETES_SERVICE_HOST is set")
	fs.StringVar(&f.manifests, "manifests", "", "read cluster state from the manifests in this directory instead of the API")
	fs.StringVar(&f.logLevel, "log-level", "warn", "log verbosity: debug, info, warn or error")
	return cmd
}
