package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/testkit/synth"
)

// writeSynth writes the benchmark cluster as one YAML file per object.
func writeSynth(b *testing.B, dir string) {
	if _, err := synth.WriteObjectFiles(dir, synth.Generate(synth.Default())); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSourceLoad measures reading the benchmark cluster from 16,000 files. It also reports
// the CPU time per load (cpu-ms), which other jobs on a shared machine disturb less than the wall
// time.
func BenchmarkSourceLoad(b *testing.B) {
	dir := b.TempDir()
	writeSynth(b, dir)
	runtime.GC()
	cpu0 := cpuTime(b)
	for b.Loop() {
		if _, errs := Load(dir, nil); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
	b.ReportMetric(ms(cpuTime(b)-cpu0)/float64(b.N), "cpu-ms")
}

// cpuTime returns the user and system CPU time of the process so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkSourceUpdate measures what the source does for an event on one file of 16,000: read
// and parse it, update the objects and publish a snapshot (with its copy of the Revision).
func BenchmarkSourceUpdate(b *testing.B) {
	dir := b.TempDir()
	writeSynth(b, dir)
	s := New(dir, nil)
	if err := s.reload(nil); err != nil {
		b.Fatal(err)
	}
	name := "pod-ns-00001-pod-000001.yaml"
	pod := s.Snapshot().Pods.Get("ns-00001/pod-000001").APIObject()
	i := 0
	for b.Loop() {
		b.StopTimer() // the write is the file system's, not the source's
		i++
		pod.Labels["app"] = fmt.Sprintf("app-%d", i)
		data, err := yaml.Marshal(pod)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		before := s.Snapshot()
		if err := s.update([]string{name}, false, nil); err != nil {
			b.Fatal(err)
		}
		if st := s.Snapshot(); st == before || len(st.Changes.Pods) != 1 {
			b.Fatalf("changes: %+v", st.Changes)
		}
	}
}

// BenchmarkRevisionCopy measures what a change of one file of 16,000 costs the Revision that
// the change publishes (a full copy of the map before FileHashes: about 1 ms and 1.3 MB).
func BenchmarkRevisionCopy(b *testing.B) {
	files := map[string]string{}
	for i := range 16000 {
		files[fmt.Sprintf("pod-ns-%05d-pod-%06d.yaml", i%1000, i)] = fmt.Sprintf("%064x", i)
	}
	fh := cluster.FileHashesOf(files)
	i := 0
	for b.Loop() {
		i++
		fh = fh.With(map[string]string{fmt.Sprintf("pod-ns-%05d-pod-%06d.yaml", i%1000, i%16000): fmt.Sprintf("%064x", i)})
	}
}
