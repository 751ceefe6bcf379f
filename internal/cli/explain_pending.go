package cli

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/source/manifests"
)

// unscheduled is the node explain judges a pod at when it has none yet: its rules are those of
// whichever node it lands on, since a pod's verdicts do not depend on its node.
const unscheduled = "(unscheduled)"

// withPodFile returns st with the pod of the manifest file arg, and its key, when arg names a
// file and no pod of st: a pod that is not applied yet can be explained before it is. The file
// is read by the manifests source's own parser, so it is held to what the agent would accept.
func withPodFile(st *cluster.State, flag, arg string) (*cluster.State, string, error) {
	if st.Pods.Get(arg) != nil {
		return st, arg, nil
	}
	fi, err := os.Stat(arg)
	if err != nil || fi.IsDir() {
		return st, arg, nil // not a file: resolveEndpoint says what is wrong with it
	}
	data, err := os.ReadFile(arg)
	if err != nil {
		return nil, "", fmt.Errorf("%s %s: %w", flag, arg, err)
	}
	dir, err := os.MkdirTemp("", "netwarden-explain-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	// A name of its own: the source ignores names that start with a dot, and reads JSON by
	// its extension.
	name := "pod.yaml"
	if filepath.Ext(arg) == ".json" {
		name = "pod.json"
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		return nil, "", err
	}
	file, errs := manifests.Load(dir, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, "", fmt.Errorf("%s %s: %w", flag, arg, errorsIn(errs, filepath.Join(dir, name), arg))
	}
	if file.Pods.Len() != 1 || len(file.Policies)+len(file.ClusterPolicies)+len(file.Nodes) > 0 {
		return nil, "", fmt.Errorf("%s %s: want a manifest of one Pod, found %d pods, %d NetworkPolicies, %d ClusterNetworkPolicies and %d nodes",
			flag, arg, file.Pods.Len(), len(file.Policies), len(file.ClusterPolicies), len(file.Nodes))
	}
	var key string
	var pod *cluster.Pod
	for k, p := range file.Pods.All() {
		key, pod = k, p
	}
	if st.Namespaces[pod.Namespace] == nil {
		return nil, "", fmt.Errorf("%s %s: the pod's namespace %q does not exist, so no policy can select the pod", flag, arg, pod.Namespace)
	}
	out := *st
	out.Pods = st.Pods.Clone()
	out.Pods.Set(key, pod)
	out.Changes = nil
	return &out, key, nil
}

// errorsIn joins the manifests source's errors, naming the file as the caller named it.
func errorsIn(errs []error, tmp, path string) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = strings.ReplaceAll(e.Error(), tmp, path)
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// noteStandIn tells, after a direction judged at local towards a peer with a stand-in address,
// which rules of the policies judging local name addresses, so could judge the peer otherwise
// once it has its own.
func noteStandIn(out io.Writer, rs *policy.Ruleset, dir policy.Direction, localIP netip.Addr, peer endpoint) {
	byAddress := rs.AddressRules(dir, localIP)
	if len(byAddress) == 0 {
		fmt.Fprintf(out, "           (%s has no address yet; no rule judging this direction names addresses, so the verdict holds whatever address it gets)\n", peer.name)
		return
	}
	fmt.Fprintf(out, "           (%s has no address yet: rules of %s name addresses (ipBlock, networks), so this verdict may change with the address it gets)\n",
		peer.name, strings.Join(byAddress, ", "))
}
