package minicluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The files of a cluster that outlives the command that started it (make cluster-up), in its
// state directory.
const (
	pidFile        = "pid"
	readyFile      = "ready"
	logFile        = "cluster.log"
	KubeconfigFile = "kubeconfig"
)

// Serve runs a cluster in the foreground until SIGINT or SIGTERM, then tears it down. The
// admin kubeconfig is copied to <stateDir>/kubeconfig, and <stateDir>/ready is written once
// the cluster is ready (Up waits for it).
func Serve(stateDir string, opts Options, log *slog.Logger) error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	os.Remove(filepath.Join(stateDir, readyFile))
	if err := os.WriteFile(filepath.Join(stateDir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(stateDir, pidFile))
	work, err := os.MkdirTemp(stateDir, "run-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)

	s := &Session{Dir: work, Log: log}
	defer s.Close()
	var c *Cluster
	began := time.Now()
	if err := s.Run(func() { c = Start(s, opts) }); err != nil {
		return err
	}
	kubeconfig := filepath.Join(stateDir, KubeconfigFile)
	data, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		return err
	}
	log.Info("cluster ready", "nodes", len(c.Nodes), "took", time.Since(began).Round(time.Millisecond), "kubeconfig", kubeconfig)
	if err := os.WriteFile(filepath.Join(stateDir, readyFile), nil, 0o644); err != nil {
		return err
	}
	sig := <-stop
	log.Info("tearing the cluster down", "signal", sig.String())
	os.Remove(filepath.Join(stateDir, readyFile))
	return nil
}

// Up starts `self serve args...` in the background (its own session, its output in
// <stateDir>/cluster.log) and waits until the cluster is ready or the server has exited.
func Up(stateDir string, serveArgs []string, timeout time.Duration, out io.Writer) error {
	if pid, alive := running(stateDir); alive {
		return fmt.Errorf("a cluster is already up (pid %d, state in %s): make cluster-down first", pid, stateDir)
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(stateDir, logFile)
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer lf.Close()
	os.Remove(filepath.Join(stateDir, readyFile))
	cmd := exec.Command(self, append([]string{"serve", "--state", stateDir}, serveArgs...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(timeout)
	for {
		if _, err := os.Stat(filepath.Join(stateDir, readyFile)); err == nil {
			fmt.Fprintf(out, "cluster up (pid %d); log: %s\n", cmd.Process.Pid, logPath)
			return nil
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("the cluster server exited before it was ready (%v); %s:\n%s", err, logPath, tail(string(log), 8000))
		case <-deadline:
			cmd.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("cluster not ready after %v (stopping it); see %s", timeout, logPath)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Down stops the cluster that Up started and waits until it has torn everything down.
func Down(stateDir string, timeout time.Duration) error {
	pid, alive := running(stateDir)
	if !alive {
		return errors.New("no cluster is up (no live pid in " + filepath.Join(stateDir, pidFile) + ")")
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for syscall.Kill(pid, 0) == nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster server %d still running after %v; see %s", pid, timeout, filepath.Join(stateDir, logFile))
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

func running(stateDir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(stateDir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, syscall.Kill(pid, 0) == nil
}
