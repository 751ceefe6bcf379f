package masquerade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// ConfigFile is the --masq-config file, watched: every write, rename or ConfigMap update
// (which swaps a symlink in the file's directory) reloads it. A file that fails to parse is
// reported and the last good config stays in effect, so a bad edit never half-applies.
type ConfigFile struct {
	path              string
	allReservedRanges bool
	log               *slog.Logger

	mu      sync.Mutex
	cur     Config
	good    bool   // cur holds a config that parsed
	raw     []byte // the content cur came from; nil for a missing file
	present bool
	lastErr error
	// readSum is the hex SHA-256 of the bytes last read, whether they parsed or not.
	readSum string
}

// ConfigState is the config in effect and what the file held when last read.
type ConfigState struct {
	Config Config
	// Good: Config came from the file (or the defaults); false until the file once parsed.
	Good bool
	// Sum is the hex SHA-256 of the content Config came from, and ReadSum that of the bytes
	// last read; they differ while the file holds a config that does not parse. Both are
	// empty without a file.
	Sum, ReadSum string
	// Err is why the latest load failed.
	Err error
}

// State returns the config in effect with the hashes of its content and of the content last
// read, so a writer of the file can tell when its write was taken (or refused).
func (c *ConfigFile) State() ConfigState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := ConfigState{Config: c.cur, Good: c.good, ReadSum: c.readSum, Err: c.lastErr}
	if c.path != "" && c.good {
		st.Sum = hexSum(c.raw)
	}
	return st
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// NewConfigFile returns the config at path; an empty path means the defaults, not watched.
func NewConfigFile(path string, allReservedRanges bool, log *slog.Logger) *ConfigFile {
	if log == nil {
		log = slog.Default()
	}
	c := &ConfigFile{path: path, allReservedRanges: allReservedRanges, log: log}
	if path == "" {
		c.cur, c.good = DefaultConfig(allReservedRanges), true
	}
	return c
}

// Current returns the config in effect, whether there is one (false until the file has once
// parsed), and the error of the latest load, if it failed.
func (c *ConfigFile) Current() (Config, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.good, c.lastErr
}

// Reload reads the file now and reports whether the config in effect changed. A load error is
// returned and remembered, and leaves the previous config in effect.
func (c *ConfigFile) Reload() (bool, error) {
	if c.path == "" {
		return false, nil
	}
	data, err := os.ReadFile(c.path)
	present := err == nil
	if errors.Is(err, os.ErrNotExist) {
		data, err = nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.lastErr = fmt.Errorf("masquerade config %s: %w", c.path, err)
		return false, c.lastErr
	}
	c.readSum = hexSum(data)
	if c.good && present == c.present && bytes.Equal(data, c.raw) {
		c.lastErr = nil
		return false, nil
	}
	cfg, err := ParseConfig(data, c.allReservedRanges)
	if err != nil {
		c.lastErr = fmt.Errorf("masquerade config %s: %w", c.path, err)
		return false, c.lastErr
	}
	if !present {
		c.log.Info("masquerade config file absent; using ip-masq-agent defaults", "path", c.path)
	}
	c.cur, c.good, c.raw, c.present, c.lastErr = cfg, true, data, present, nil
	return true, nil
}

// Watch reloads the file whenever its directory changes and calls notify after each reload
// that changed the config or failed. It returns when ctx is done. The directory, not the
// file, is watched: editors and ConfigMap updates replace the file rather than write it.
func (c *ConfigFile) Watch(ctx context.Context, notify func()) error {
	if c.path == "" {
		<-ctx.Done()
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching masquerade config: %w", err)
	}
	defer w.Close()
	dir := filepath.Dir(c.path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching masquerade config directory %s: %w", dir, err)
	}
	// A change between the first load and the watch starting would otherwise be missed.
	c.reloadAndNotify(notify, true)
	// Every event reloads at once, so a change applies within milliseconds; reading an
	// unchanged file costs a read and a compare. A file that does not parse may be half
	// written by an editor that writes in place, so it is reported only once the directory
	// has been quiet for a moment and it still does not parse.
	var quiet <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return errors.New("masquerade config watcher closed")
			}
			if !c.reloadAndNotify(notify, false) {
				quiet = time.After(50 * time.Millisecond)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("masquerade config watcher closed")
			}
			c.log.Warn("masquerade config watch error; reloading", "err", err)
			quiet = time.After(50 * time.Millisecond)
		case <-quiet:
			quiet = nil
			c.reloadAndNotify(notify, true)
		}
	}
}

// reloadAndNotify reloads the file and calls notify when the config in effect changed, or when
// the file is invalid and report is set (the error is logged then too). It reports whether the
// file parsed.
func (c *ConfigFile) reloadAndNotify(notify func(), report bool) bool {
	changed, err := c.Reload()
	if err != nil && report {
		c.log.Error("invalid masquerade config; the last good rules stay in effect", "err", err)
		notify()
	}
	if changed {
		notify()
	}
	return err == nil
}
