package policy

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

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
	// The map the previous compile used becomes the next one's, emptied, so that a compile
	// allocates no new table.
	old := c.prev
	c.prev, c.cur = c.cur, old
	if c.cur == nil {
		c.cur = make(map[*metav1.LabelSelector]parsedSelector, len(c.prev))
	}
	clear(c.cur)
}
