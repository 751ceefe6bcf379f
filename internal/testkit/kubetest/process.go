package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is a started child process whose output goes to a LogBuffer.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // of Wait, set before done is closed
}

// spawnReqs feeds the goroutine of OnSpawnThread, started once.
var (
	spawnOnce sync.Once
	spawnReqs chan func()
)

// OnSpawnThread runs fn, which starts a process, on the one OS thread that starts every test
// process. The kernel sends Pdeathsig when the OS thread that started a process exits, not when
// the test binary does, and the netns test bed retires OS threads on purpose. So every process
// (etcd, kube-apiserver, kube-proxy, agents) is started from one goroutine that stays locked
// to its thread for the life of the binary.
func OnSpawnThread(fn func()) {
	spawnOnce.Do(func() {
		spawnReqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
			for req := range spawnReqs {
				req()
			}
		}()
	})
	done := make(chan struct{})
	spawnReqs <- func() { fn(); close(done) }
	<-done
}

func startProcess(path string, args []string, logs *LogBuffer) (*process, error) {
	return startProcessEnv(path, args, nil, logs)
}

// Process is a child process that a kit runs (a control-plane component, a node's agent): it
// gets SIGKILL when the process that started it dies, and its output goes to a LogBuffer.
type Process struct{ p *process }

// StartProcess starts path with args and env (nil: this process's environment).
func StartProcess(path string, args, env []string, logs *LogBuffer) (*Process, error) {
	p, err := startProcessEnv(path, args, env, logs)
	if err != nil {
		return nil, err
	}
	return &Process{p}, nil
}

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (bool, error) { return p.p.exited() }

// Stop sends SIGTERM, then SIGKILL when the process has not exited after timeout (at once for
// a zero timeout), and waits for it.
func (p *Process) Stop(timeout time.Duration) { p.p.stop(timeout) }

func startProcessEnv(path string, args, env []string, logs *LogBuffer) (*process, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout = logs
	cmd.Stderr = logs
	cmd.SysProcAttr = sysProcAttr()
	var err error
	OnSpawnThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, and SIGKILL if the process has not exited after timeout. A zero timeout
// sends SIGKILL only.
func (p *process) stop(timeout time.Duration) {
	if timeout <= 0 {
		_ = p.cmd.Process.Kill()
		<-p.done
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

const logLimit = 4 << 20 // bytes of each process's log kept in memory

// LogBuffer keeps the last 4 MiB written to it (a process's output), and copies them to stderr
// when $KUBETEST_VERBOSE is set.
type LogBuffer struct {
	name string
	tee  bool
	mu   sync.Mutex
	buf  []byte
}

// NewLogBuffer returns a LogBuffer whose copies to stderr are prefixed with name.
func NewLogBuffer(name string) *LogBuffer {
	return &LogBuffer{name: name, tee: os.Getenv(EnvVerbose) != ""}
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tee {
		for _, line := range strings.SplitAfter(string(p), "\n") {
			if line != "" {
				fmt.Fprintf(os.Stderr, "[%s] %s", b.name, line)
			}
		}
	}
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - logLimit; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
