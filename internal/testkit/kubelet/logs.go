package kubelet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
)

// Container logs are files in the CRI logging format, one per container instance, as the
// kubelet keeps them: each line is "<RFC3339Nano time> <stream> <P|F> <text>", F ending a line
// and P a part of a longer one. That keeps the streams and times apart for the containerLogs
// options (timestamps, sinceTime, tailLines).

const maxLogLine = 16 << 10 // longer lines are split into P parts, as CRI runtimes do

// logFile is the log of one container instance, written by one goroutine per stream.
type logFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
	wg   sync.WaitGroup
	// done is closed when both streams reached EOF: a follower stops at the end then.
	done chan struct{}
}

func newLogFile(path string) (*logFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	return &logFile{path: path, f: f, done: make(chan struct{})}, nil
}

// copyStream writes r's lines as stream ("stdout" or "stderr") until EOF.
func (l *logFile) copyStream(stream string, r io.ReadCloser) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer r.Close()
		br := bufio.NewReaderSize(r, maxLogLine)
		for {
			line, err := br.ReadSlice('\n')
			if len(line) > 0 {
				tag := "P"
				if line[len(line)-1] == '\n' {
					tag, line = "F", line[:len(line)-1]
				}
				l.write(stream, tag, line)
			}
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				return
			}
		}
	}()
}

func (l *logFile) write(stream, tag string, text []byte) {
	var b bytes.Buffer
	b.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(stream)
	b.WriteByte(' ')
	b.WriteString(tag)
	b.WriteByte(' ')
	b.Write(text)
	b.WriteByte('\n')
	l.mu.Lock()
	_, _ = l.f.Write(b.Bytes())
	l.mu.Unlock()
}

// closeWhenDone closes the file once the streams have ended, and then done.
func (l *logFile) closeWhenDone() {
	go func() {
		l.wg.Wait()
		l.mu.Lock()
		_ = l.f.Close()
		l.mu.Unlock()
		close(l.done)
	}()
}

// logEntry is one parsed line of a log file.
type logEntry struct {
	ts     time.Time
	stream string
	full   bool
	text   []byte
}

func parseLogLine(line []byte) (logEntry, bool) {
	f := bytes.SplitN(line, []byte{' '}, 4)
	if len(f) != 4 {
		return logEntry{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(f[0]))
	if err != nil {
		return logEntry{}, false
	}
	return logEntry{ts: ts, stream: string(f[1]), full: string(f[2]) == "F", text: f[3]}, true
}

// readLogs streams the log of lf as the containerLogs API does: the text of each line (with
// its time first when Timestamps), from SinceTime/SinceSeconds, the last Tail lines, at most
// LimitBytes, and with Follow, what is written later until the instance ends or ctx is done.
func readLogs(ctx context.Context, lf *logFile, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	f, err := os.Open(lf.path)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	since := opts.SinceTime
	if opts.SinceSeconds > 0 {
		since = time.Now().Add(-time.Duration(opts.SinceSeconds) * time.Second)
	}
	go func() {
		defer f.Close()
		pw := closer{pw}
		w := &limitWriter{w: pw, left: int64(opts.LimitBytes)}
		emit := func(e logEntry) error {
			if !since.IsZero() && e.ts.Before(since) {
				return nil
			}
			var b bytes.Buffer
			if opts.Timestamps {
				b.WriteString(e.ts.Format(time.RFC3339Nano))
				b.WriteByte(' ')
			}
			b.Write(e.text)
			if e.full {
				b.WriteByte('\n')
			}
			_, err := w.Write(b.Bytes())
			return err
		}
		br := bufio.NewReaderSize(f, 64<<10)
		var pending []byte // a line whose end is not written yet
		// readLines returns the complete lines available now.
		readLines := func() ([]logEntry, error) {
			var out []logEntry
			for {
				chunk, err := br.ReadBytes('\n')
				pending = append(pending, chunk...)
				if err != nil {
					if errors.Is(err, io.EOF) {
						return out, nil
					}
					return out, err
				}
				if e, ok := parseLogLine(bytes.TrimSuffix(pending, []byte{'\n'})); ok {
					e.text = bytes.Clone(e.text)
					out = append(out, e)
				}
				pending = pending[:0]
			}
		}
		entries, err := readLines()
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		if opts.Tail > 0 && len(entries) > opts.Tail {
			entries = entries[len(entries)-opts.Tail:]
		}
		for _, e := range entries {
			if err := emit(e); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		for opts.Follow {
			select {
			case <-ctx.Done():
				pw.Close()
				return
			case <-lf.done:
				entries, err := readLines() // the rest written before the end
				for _, e := range entries {
					if emit(e) != nil {
						break
					}
				}
				pw.CloseWithError(err)
				return
			case <-time.After(100 * time.Millisecond):
			}
			entries, err := readLines()
			for _, e := range entries {
				if err == nil {
					err = emit(e)
				}
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.Close()
	}()
	return pr, nil
}

// closer ends the stream cleanly when limitBytes was reached.
type closer struct{ *io.PipeWriter }

func (c closer) CloseWithError(err error) {
	if errors.Is(err, errLimit) {
		err = nil
	}
	_ = c.PipeWriter.CloseWithError(err)
}

// limitWriter stops with errLimit after left bytes (left 0: no limit).
type limitWriter struct {
	w    io.Writer
	left int64
	used bool
}

var errLimit = errors.New("limitBytes reached")

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left == 0 && !l.used {
		return l.w.Write(p)
	}
	l.used = true
	if int64(len(p)) > l.left {
		p = p[:l.left]
		n, err := l.w.Write(p)
		l.left -= int64(n)
		if err == nil {
			err = errLimit
		}
		return n, err
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}
