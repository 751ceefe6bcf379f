package minicluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

// Session is the kubetest.TB of a command that runs a cluster outside `go test` (make
// cluster-up): Fatal and Skip end the run that Run guards, Cleanup's functions run at Close,
// last first, and temporary directories live under Dir.
type Session struct {
	Dir string
	Log *slog.Logger

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temps    int
}

// sessionFatal is the panic of Session.Fatal, recovered by Run.
type sessionFatal struct{ msg string }

// Run calls fn, and returns as an error a Fatal or Skip that fn (or a kit it calls) raised.
func (s *Session) Run(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(sessionFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(f.msg)
		}
	}()
	fn()
	return nil
}

func (s *Session) Helper() {}

func (s *Session) Logf(format string, args ...any) { s.Log.Info(fmt.Sprintf(format, args...)) }

func (s *Session) Fatal(args ...any) { s.fail(fmt.Sprint(args...)) }

func (s *Session) Fatalf(format string, args ...any) { s.fail(fmt.Sprintf(format, args...)) }

// Skip is a failure here: a command cannot skip what it was asked to run.
func (s *Session) Skip(args ...any) { s.fail(fmt.Sprint(args...)) }

func (s *Session) fail(msg string) {
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
	panic(sessionFatal{msg})
}

func (s *Session) Cleanup(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, fn)
}

func (s *Session) TempDir() string {
	s.mu.Lock()
	s.temps++
	dir := filepath.Join(s.Dir, fmt.Sprintf("tmp%03d", s.temps))
	s.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.fail(err.Error())
	}
	return dir
}

func (s *Session) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Close runs the cleanups, last registered first.
func (s *Session) Close() {
	s.mu.Lock()
	fns := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}
