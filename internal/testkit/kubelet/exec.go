package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"golang.org/x/sys/unix"
)

// outputGrace is how long an exec waits for its output after the command exited: a process it
// left in the background may hold the pipe open.
const outputGrace = 2 * time.Second

// execIO is what an exec session is attached to. Nil streams are not attached.
type execIO struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	tty            bool
	resize         <-chan api.TermSize
}

// execIn runs argv in container c as a CRI exec does: in the pod's network and UTS namespaces
// and root filesystem, with the container's environment and working directory. It returns the
// command's exit code (128+n when killed by signal n); an error means it did not run. ctx's
// end kills it.
func (p *podState) execIn(ctx context.Context, c *container, argv []string, stdio execIO) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("no command given")
	}
	p.mu.Lock()
	sb := p.sb
	running := c.proc != nil && sb != nil
	penv := append([]string{}, c.penv...)
	p.mu.Unlock()
	if !running || !sb.usable() {
		return 0, fmt.Errorf("container %s of pod %s is not running", c.spec.Name, p.key)
	}
	path, err := lookPathIn(sb.rootfs, argv[0], penv)
	if err != nil {
		return 0, err
	}
	dir := c.spec.WorkingDir
	if dir == "" {
		dir = "/"
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: penv, Dir: dir, SysProcAttr: &unix.SysProcAttr{}}

	var copies sync.WaitGroup
	var readers []*os.File // closed when the output grace is over
	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	if stdio.tty {
		master, slave, err := openPTY()
		if err != nil {
			return 0, fmt.Errorf("allocating a terminal: %w", err)
		}
		defer master.Close()
		childEnds = append(childEnds, slave)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		if stdio.stdin != nil {
			go func() { _, _ = io.Copy(master, stdio.stdin) }()
		}
		if stdio.stdout != nil {
			copies.Add(1)
			go func() {
				defer copies.Done()
				_, _ = io.Copy(stdio.stdout, master) // ends with EIO once no process holds the terminal
			}()
		}
		readers = append(readers, master)
		if stdio.resize != nil {
			go func() {
				for s := range stdio.resize {
					_ = ptyControl(master, func(fd int) error {
						return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: s.Height, Col: s.Width})
					})
				}
			}()
		}
	} else {
		cmd.SysProcAttr.Setpgid = true
		if stdio.stdin != nil {
			r, w, err := os.Pipe()
			if err != nil {
				return 0, err
			}
			childEnds = append(childEnds, r)
			cmd.Stdin = r
			go func() {
				_, _ = io.Copy(w, stdio.stdin)
				w.Close()
			}()
		}
		for _, out := range []struct {
			dst io.Writer
			set *io.Writer
		}{{stdio.stdout, &cmd.Stdout}, {stdio.stderr, &cmd.Stderr}} {
			if out.dst == nil {
				continue
			}
			r, w, err := os.Pipe()
			if err != nil {
				return 0, err
			}
			childEnds = append(childEnds, w)
			readers = append(readers, r)
			*out.set = w
			copies.Add(1)
			go func() {
				defer copies.Done()
				_, _ = io.Copy(out.dst, r)
			}()
		}
	}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()

	if err := sb.start(p.d.spawner, cmd); err != nil {
		return 0, fmt.Errorf("starting %q in container %s: %w", argv, c.spec.Name, err)
	}
	for _, f := range childEnds {
		f.Close()
	}
	childEnds = nil
	p.mu.Lock()
	p.execs[cmd.Process] = struct{}{}
	if p.ctx.Err() != nil { // the pod is being killed: killContainers may not have seen this one
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.execs, cmd.Process)
		p.mu.Unlock()
	}()

	waited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		case <-waited:
		}
	}()
	_ = cmd.Wait()
	close(waited)
	copied := make(chan struct{})
	go func() { copies.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(outputGrace):
		for _, r := range readers {
			r.Close()
		}
		<-copied
	}
	code, _ := exitStatus(cmd.ProcessState)
	return code, nil
}

// openPTY allocates a pseudo-terminal pair. The master stays in non-blocking mode (its ioctls
// go through SyscallConn, not Fd), so that closing it ends a read blocked on it.
func openPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var n int
	err = ptyControl(m, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlocking the terminal: %w", err)
		}
		var err error
		if n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("naming the terminal: %w", err)
		}
		return nil
	})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, s, nil
}

func ptyControl(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := rc.Control(func(fd uintptr) { fnErr = fn(int(fd)) }); err != nil {
		return err
	}
	return fnErr
}
