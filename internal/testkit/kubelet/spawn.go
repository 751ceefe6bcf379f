package kubelet

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// spawner starts the processes of containers, exec sessions and exec probes. A child inherits
// the network and UTS namespaces of the thread that forks it, so one OS thread, locked for the
// daemon's lifetime, enters a pod's namespaces, forks, and goes back. It is one thread for a
// second reason: the children get SIGKILL as their parent-death signal, which Linux sends when
// the forking *thread* ends, and a thread of Go's pool may end at any time (whenever a goroutine
// that locked it exits without unlocking, as namespace helpers do).
type spawner struct {
	mu     sync.RWMutex
	closed bool
	reqs   chan spawnReq
	done   chan struct{}
}

type spawnReq struct {
	netns, uts *os.File
	cmd        *exec.Cmd
	result     chan error
}

func newSpawner() (*spawner, error) {
	s := &spawner{reqs: make(chan spawnReq), done: make(chan struct{})}
	ready := make(chan error, 1)
	go s.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return s, nil
}

func (s *spawner) loop(ready chan<- error) {
	runtime.LockOSThread()
	// Never unlocked: the thread carries the children's parent-death signal, and it must not go
	// back to Go's pool after it has been in other namespaces.
	origNet, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		ready <- fmt.Errorf("spawner: %w", err)
		return
	}
	origUTS, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/uts", unix.Gettid()))
	if err != nil {
		origNet.Close()
		ready <- fmt.Errorf("spawner: %w", err)
		return
	}
	ready <- nil
	for req := range s.reqs {
		err := s.spawn(req, origNet, origUTS)
		req.result <- err
		if errors.Is(err, errSpawnerTainted) {
			// The thread is stuck in a pod's namespace: it must neither fork again nor end
			// before close (its children would get SIGKILL). Refuse every later request.
			for req := range s.reqs {
				req.result <- err
			}
			break
		}
	}
	close(s.done)
	// Returning with the thread locked ends it, and with it the children still alive.
}

var errSpawnerTainted = errors.New("spawner: cannot return to the daemon's namespaces")

func (s *spawner) spawn(req spawnReq, origNet, origUTS *os.File) error {
	if err := unix.Setns(int(req.netns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering the pod's network namespace: %w", err)
	}
	startErr := func() error {
		if err := unix.Setns(int(req.uts.Fd()), unix.CLONE_NEWUTS); err != nil {
			return fmt.Errorf("entering the pod's UTS namespace: %w", err)
		}
		return req.cmd.Start()
	}()
	err1 := unix.Setns(int(origUTS.Fd()), unix.CLONE_NEWUTS)
	err2 := unix.Setns(int(origNet.Fd()), unix.CLONE_NEWNET)
	if err1 != nil || err2 != nil {
		if req.cmd.Process != nil && startErr == nil {
			return errors.Join(errSpawnerTainted, err1, err2)
		}
		return errors.Join(errSpawnerTainted, startErr, err1, err2)
	}
	return startErr
}

// start starts cmd in the given network and UTS namespaces. cmd.SysProcAttr is completed with
// the parent-death signal.
func (s *spawner) start(netns, uts *os.File, cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &unix.SysProcAttr{}
	}
	if cmd.SysProcAttr.Chroot == "" {
		// Without it the process would run in the host's root: never.
		return errors.New("spawner: no root filesystem to chroot into")
	}
	cmd.SysProcAttr.Pdeathsig = unix.SIGKILL
	req := spawnReq{netns: netns, uts: uts, cmd: cmd, result: make(chan error, 1)}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return errors.New("the daemon is stopped")
	}
	s.reqs <- req
	s.mu.RUnlock()
	return <-req.result
}

// close ends the spawner's thread. Children it started get SIGKILL: call it once they are
// meant to be gone.
func (s *spawner) close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.reqs)
	}
	s.mu.Unlock()
	<-s.done
}
