package testbed

import (
	"errors"

	"github.com/vishvananda/netns"
)

// InNetNSGo runs fn on a fresh goroutine whose thread is in the pod's netns, and waits for it.
// Sockets fn opens stay in that netns, so a test can hold long-lived connections of a pod.
func (p *Pod) InNetNSGo(fn func() error) error {
	h, err := p.dupNS()
	if err != nil {
		return err
	}
	defer h.Close()
	return inNetNSGo(h, fn)
}

func (p *Pod) dupNS() (netns.NsHandle, error) {
	b := p.node.bed
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !p.ns.IsOpen() {
		return netns.None(), errors.New("testbed: pod netns is gone")
	}
	return dupNS(p.ns)
}
