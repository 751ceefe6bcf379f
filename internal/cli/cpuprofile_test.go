package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCPUProfileWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A profile is gzip-compressed protocol buffers.
	if !bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
		t.Fatalf("not a profile: %q", data[:min(len(data), 16)])
	}
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "missing", "cpu.prof")); err == nil {
		t.Fatal("a profile path in a missing directory was accepted")
	}
}
