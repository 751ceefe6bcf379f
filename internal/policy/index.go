package policy

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// podInfo is an eligible pod: running or pending with IPs, not on the host network.
type podInfo struct {
	pod    *corev1.Pod
	key    string
	ips    []netip.Addr
	labels labels.Set
}

// labelIndex finds the objects a selector may match without testing every object: a
// selector's equality, In or Exists requirement narrows the candidates to one posting list.
type labelIndex[T any] struct {
	all     []T
	byValue map[string]map[string][]T // label key -> value -> objects
	byKey   map[string][]T            // label key -> objects having it
}

func newLabelIndex[T any]() *labelIndex[T] {
	return &labelIndex[T]{byValue: map[string]map[string][]T{}, byKey: map[string][]T{}}
}

func (ix *labelIndex[T]) add(obj T, l map[string]string) {
	ix.all = append(ix.all, obj)
	for k, v := range l {
		m := ix.byValue[k]
		if m == nil {
			m = map[string][]T{}
			ix.byValue[k] = m
		}
		m[v] = append(m[v], obj)
		ix.byKey[k] = append(ix.byKey[k], obj)
	}
}

// candidates returns a superset of the objects sel matches, as small as one requirement
// allows. The caller still tests each candidate against the whole selector.
func (ix *labelIndex[T]) candidates(sel labels.Selector) []T {
	reqs, selectable := sel.Requirements()
	if !selectable {
		return nil
	}
	best := ix.all
	for _, r := range reqs {
		var list []T
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			vals := r.Values().UnsortedList()
			if len(vals) == 1 {
				list = ix.byValue[r.Key()][vals[0]]
			} else {
				for _, v := range vals {
					list = append(list, ix.byValue[r.Key()][v]...)
				}
			}
		case selection.Exists:
			list = ix.byKey[r.Key()]
		default:
			continue
		}
		if len(list) < len(best) {
			best = list
		}
	}
	return best
}

// selectorCache parses each LabelSelector once. Policies in a snapshot are immutable and
// replaced on change, so a selector's address identifies its content across compiles too.
type selectorCache struct {
	prev, cur map[*metav1.LabelSelector]parsedSelector
}

type parsedSelector struct {
	sel labels.Selector
	key string // canonical text, for naming shared sets
}

func (c *selectorCache) get(ls *metav1.LabelSelector) parsedSelector {
	if p, ok := c.cur[ls]; ok {
		return p
	}
	p, ok := c.prev[ls]
	if !ok {
		s, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			// Sources validate selectors; should one slip through, match nothing rather
			// than everything so the failure closes instead of opening.
			s = labels.Nothing()
		}
		p = parsedSelector{sel: s, key: s.String()}
	}
	c.cur[ls] = p
	return p
}

// rotate starts a new compile: entries not used by the previous one are dropped.
func (c *selectorCache) rotate() {
	c.prev, c.cur = c.cur, map[*metav1.LabelSelector]parsedSelector{}
}
