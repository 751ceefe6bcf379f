package policy

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// StagedAnnotation marks a NetworkPolicy or ClusterNetworkPolicy as staged when "true": it
// changes no verdict, and what it would change is reported (explain --staged).
const StagedAnnotation = cluster.StagedAnnotation

// IsStaged reports whether an object is staged.
func IsStaged(o metav1.Object) bool { return o.GetAnnotations()[StagedAnnotation] == "true" }

// stagedKeys tracks which policies of the snapshots compiled are staged, following Changes, so
// that a snapshot without staged policies costs one look per changed policy.
type stagedKeys struct {
	np, cnp map[string]bool
}

// enforced returns st without its staged policies (st itself when it has none). changed says
// whether st.Changes applies to the snapshot seen last.
func (s *stagedKeys) enforced(st *cluster.State, changed bool) *cluster.State {
	if s.np == nil || !changed {
		s.np, s.cnp = map[string]bool{}, map[string]bool{}
		for k, p := range st.Policies {
			if IsStaged(p) {
				s.np[k] = true
			}
		}
		for k, p := range st.ClusterPolicies {
			if IsStaged(p) {
				s.cnp[k] = true
			}
		}
	} else {
		for _, k := range st.Changes.Policies {
			p := st.Policies[k]
			s.np[k] = p != nil && IsStaged(p)
			if !s.np[k] {
				delete(s.np, k)
			}
		}
		for _, k := range st.Changes.ClusterPolicies {
			p := st.ClusterPolicies[k]
			s.cnp[k] = p != nil && IsStaged(p)
			if !s.cnp[k] {
				delete(s.cnp, k)
			}
		}
	}
	if len(s.np)+len(s.cnp) == 0 {
		return st
	}
	out := *st
	if len(s.np) > 0 {
		out.Policies = maps.Clone(st.Policies)
		for k := range s.np {
			delete(out.Policies, k)
		}
	}
	if len(s.cnp) > 0 {
		out.ClusterPolicies = maps.Clone(st.ClusterPolicies)
		for k := range s.cnp {
			delete(out.ClusterPolicies, k)
		}
	}
	return &out
}

// CompileAsWritten is Compile with the staged policies of st enforced, as they will be once
// their annotation is removed: what they would change.
func CompileAsWritten(st *cluster.State, node string) (*Ruleset, Stats) {
	cc := NewCompiler(node)
	cc.asWritten = true
	return cc.Compile(st)
}

// Staged lists the staged policies of st: NetworkPolicies by "namespace/name", then
// ClusterNetworkPolicies by name.
func Staged(st *cluster.State) (networkPolicies, clusterPolicies []string) {
	for k, p := range st.Policies {
		if IsStaged(p) {
			networkPolicies = append(networkPolicies, k)
		}
	}
	for k, p := range st.ClusterPolicies {
		if IsStaged(p) {
			clusterPolicies = append(clusterPolicies, k)
		}
	}
	return networkPolicies, clusterPolicies
}
