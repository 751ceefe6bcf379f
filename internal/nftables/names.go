package nftables

import (
	"fmt"
	"strings"

	"github.com/netwarden/netwarden/internal/policy"
)

// dispatchMap names the verdict map for a direction and family.
func dispatchMap(dir policy.Direction, v6 bool) string {
	d := "in"
	if dir == policy.Egress {
		d = "out"
	}
	return "dispatch-" + d + famSuffix(v6)
}

func famSuffix(v6 bool) string {
	if v6 {
		return "-v6"
	}
	return "-v4"
}

// chainNames is what the renderer derives from one chain name of the model.
type chainNames struct {
	family  [2]string // the chain of each family (see familyChain)
	checked bool      // err holds checkPolicy's answer
	err     error
}

func (rd *Renderer) namesOf(name string) *chainNames {
	n := rd.names[name]
	if n == nil {
		if rd.names == nil {
			rd.names = map[string]*chainNames{}
		}
		n = &chainNames{family: [2]string{familyChain(name, false), familyChain(name, true)}}
		rd.names[name] = n
	}
	return n
}

// familyChain is familyChain, built once per name.
func (rd *Renderer) familyChain(name string, v6 bool) string {
	if v6 {
		return rd.namesOf(name).family[1]
	}
	return rd.namesOf(name).family[0]
}

// checkPolicy is checkPolicy, answered once per name (its answer depends on nothing else).
func (rd *Renderer) checkPolicy(chain string, pr *policy.PolicyRules) error {
	n := rd.namesOf(chain)
	if !n.checked {
		n.checked, n.err = true, checkPolicy(chain, pr)
	}
	return n.err
}

// pruneNames forgets the names of chains gone, once they are most of what is kept.
func (rd *Renderer) pruneNames(r *Rendered) {
	if len(rd.names) > 2*len(r.Chains)+1024 {
		rd.names = nil
	}
}

// maxName is the longest name the kernel takes for a chain or set: NFT_NAME_MAXLEN (256)
// counts the terminating zero.
const maxName = 255

// checkPolicy reports why nft cannot program a policy's chains: a name that the kernel does not
// take or nft does not parse (a full sync sends the text to nft). The names come from the
// namespace and name of the policy, which the API limits far less.
func checkPolicy(chain string, _ *policy.PolicyRules) error {
	name := familyChain(chain, true)
	if len(name) > maxName {
		return fmt.Errorf("chain name %s is %d bytes, more than the kernel's %d", name, len(name), maxName)
	}
	for i, c := range []byte(name) {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if i == 0 && !letter && c != '_' && c != '.' ||
			!letter && (c < '0' || c > '9') && !strings.ContainsRune("/-_.", rune(c)) {
			return fmt.Errorf("chain name %s holds %q, which nft does not parse in a name", name, c)
		}
	}
	return nil
}

// familyChain names the chain that renders a group or policy of the model for one IP family:
// grp-ingress-<hash>-v4, in/<ns>/<name>-v6. The suffix is always added, so two names of the
// model never map to one chain.
func familyChain(name string, v6 bool) string { return name + famSuffix(v6) }

// dropChain names the chain that logs and drops for one ClusterNetworkPolicy Deny rule.
func dropChain(id string) string { return "drop-" + strings.TrimPrefix(id, policy.DropIDPrefix) }
