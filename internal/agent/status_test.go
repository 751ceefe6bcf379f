package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netwarden/netwarden/internal/cluster"
	"github.com/netwarden/netwarden/internal/dataplane"
	"github.com/netwarden/netwarden/internal/policy"
	"github.com/netwarden/netwarden/internal/statusapi"
)

// getStatus answers GET /status?query from a's handler in a goroutine, delivering the decoded
// status (or the HTTP error's status code and body) on the channel.
func getStatus(a *Agent, query string) <-chan statusAnswer {
	out := make(chan statusAnswer, 1)
	go func() {
		rec := httptest.NewRecorder()
		a.serveStatus(rec, httptest.NewRequest(http.MethodGet, "/status?"+query, nil))
		ans := statusAnswer{code: rec.Code}
		body, _ := io.ReadAll(rec.Body)
		ans.body = string(body)
		if rec.Code == http.StatusOK {
			ans.err = json.Unmarshal(body, &ans.st)
		}
		out <- ans
	}()
	return out
}

type statusAnswer struct {
	code int
	body string
	st   statusapi.Status
	err  error
}

// TestStatusLongPoll checks that GET /status?after=V&wait=D answers at the next change of the
// status from version V, at once when it is not at V, and when D runs out otherwise.
func TestStatusLongPoll(t *testing.T) {
	a := New(Config{NodeName: "n"})
	a.status.policy = &statusapi.FeatureStatus{Backend: "test"}
	a.status.update(&a.status.policy, func(fs *statusapi.FeatureStatus) { fs.Generation = 1 })
	first := <-getStatus(a, "")
	if first.code != http.StatusOK || first.err != nil || first.st.Version == 0 || first.st.NetworkPolicy.Generation != 1 {
		t.Fatalf("plain read: %d %v %+v", first.code, first.err, first.st)
	}
	v := first.st.Version

	// Held until the status changes.
	held := getStatus(a, "after="+itoa(v)+"&wait=1m")
	select {
	case ans := <-held:
		t.Fatalf("answered before any change: %+v", ans)
	case <-time.After(200 * time.Millisecond):
	}
	a.status.update(&a.status.policy, func(fs *statusapi.FeatureStatus) { fs.Generation = 2 })
	select {
	case ans := <-held:
		if ans.code != http.StatusOK || ans.st.Version == v || ans.st.NetworkPolicy.Generation != 2 {
			t.Fatalf("after the change: %d %+v", ans.code, ans.st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not answered after the status changed")
	}

	// A version the status is no longer at (or never was, from an earlier process): at once.
	for _, after := range []uint64{v, v + 1000} {
		select {
		case ans := <-getStatus(a, "after="+itoa(after)+"&wait=1m"):
			if ans.code != http.StatusOK || ans.st.NetworkPolicy.Generation != 2 {
				t.Fatalf("after=%d: %d %+v", after, ans.code, ans.st)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("after=%d, which the status is not at: not answered at once", after)
		}
	}

	// Readiness is part of the status too.
	cur := (<-getStatus(a, "")).st
	held = getStatus(a, "after="+itoa(cur.Version)+"&wait=1m")
	a.ready.Store(true)
	a.status.touch()
	if ans := <-held; !ans.st.Ready {
		t.Fatalf("answered without readiness: %+v", ans.st)
	}

	// No change: answered when wait runs out, with the status as it is.
	cur = (<-getStatus(a, "")).st
	start := time.Now()
	ans := <-getStatus(a, "after="+itoa(cur.Version)+"&wait=100ms")
	if ans.code != http.StatusOK || ans.st.Version != cur.Version || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("wait ran out: %d %+v after %v", ans.code, ans.st, time.Since(start))
	}
}

// TestStatusLongPollBadQuery checks that a malformed after or wait is refused with a message
// naming the parameter, instead of being answered as a plain read.
func TestStatusLongPollBadQuery(t *testing.T) {
	a := New(Config{NodeName: "n"})
	for query, want := range map[string]string{
		"after=1":              "wait=",
		"wait=1s":              "after=",
		"after=x&wait=1s":      `after="x"`,
		"after=-1&wait=1s":     `after="-1"`,
		"after=1&wait=soon":    `wait="soon"`,
		"after=1&wait=-1s":     `wait="-1s"`,
		"after=1&wait=10m":     `wait="10m"`,
		"after=1&wait=1s&x=1&": "", // other parameters are ignored
	} {
		ans := <-getStatus(a, query)
		if want == "" {
			if ans.code != http.StatusOK {
				t.Errorf("%s: %d %s", query, ans.code, ans.body)
			}
			continue
		}
		if ans.code != http.StatusBadRequest || !strings.Contains(ans.body, want) {
			t.Errorf("%s: %d %q, want 400 naming %s", query, ans.code, ans.body, want)
		}
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// TestStatusLongPollEndsWithAgent checks that a long poll held by the health server ends when
// the agent stops, instead of outliving it for the rest of its wait.
func TestStatusLongPollEndsWithAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "health.sock")
	a := New(Config{NodeName: "n", Source: &runningSource{state: cluster.NewState()}, HealthAddr: "unix:" + sock})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.serveHealth(ctx); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	done := make(chan error, 1)
	go func() {
		resp, err := client.Get("http://agent/status?after=" + itoa(a.Status().Version) + "&wait=5m")
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the request is held by now; if not, it is answered at once below anyway
	start := time.Now()
	cancel()
	select {
	case <-done:
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("the long poll ended %v after the agent stopped", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the long poll outlived the agent")
	}
}

// TestStatusClient checks that statusapi's client and this server agree on the contract: the
// trimmed read, the long poll, and a wait that ends once the status covers a write.
func TestStatusClient(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "health.sock")
	a := New(Config{NodeName: "n", Source: &runningSource{state: cluster.NewState()}, HealthAddr: "unix:" + sock})
	a.status.policy = &statusapi.FeatureStatus{Backend: "test"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.serveHealth(ctx); err != nil {
		t.Fatal(err)
	}
	hashA, hashB := statusapi.ContentHash([]byte("a")), statusapi.ContentHash([]byte("b"))
	apply := func(gen uint64, files map[string]string) {
		a.status.update(&a.status.policy, func(fs *statusapi.FeatureStatus) {
			fs.Generation = gen
			fs.Revision = cluster.Revision{Files: cluster.FileHashesOf(files)}
		})
	}
	apply(1, map[string]string{"a.yaml": hashA, "other.yaml": hashB})
	c := statusapi.UnixClient(sock)
	q := statusapi.Query{Files: []string{"a.yaml"}}

	st, err := c.Read(q)
	if err != nil || st.NetworkPolicy == nil || st.NetworkPolicy.Revision.Files.Len() != 1 || !statusapi.Covers(st, map[string]string{"a.yaml": hashA}) {
		t.Fatalf("trimmed read: %+v, %v", st, err)
	}

	changed := make(chan statusapi.Status, 1)
	go func() {
		st, _ := c.ReadChanged(q, st.Version, time.Minute)
		changed <- st
	}()
	time.Sleep(50 * time.Millisecond) // held by now; if not, it is answered at once below anyway
	apply(2, map[string]string{"a.yaml": hashB})
	select {
	case got := <-changed:
		if got.Version == st.Version || !statusapi.Covers(got, map[string]string{"a.yaml": hashB}) {
			t.Fatalf("long poll answered with %+v", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the long poll was not answered at the change")
	}

	go func() {
		time.Sleep(50 * time.Millisecond)
		apply(3, map[string]string{"a.yaml": hashA})
	}()
	covered := func(st statusapi.Status) bool { return statusapi.Covers(st, map[string]string{"a.yaml": hashA}) }
	if err := c.Wait(time.Now().Add(30*time.Second), func() statusapi.Query { return q }, covered, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	var late *statusapi.DeadlineError
	never := func(statusapi.Status) bool { return false }
	if err := c.Wait(time.Now().Add(100*time.Millisecond), func() statusapi.Query { return q }, never, func() error { return nil }); !errors.As(err, &late) || late.Last.Version == 0 {
		t.Fatalf("wait past its deadline: %v", err)
	}
}

// skippingBackend is a NetworkPolicy backend that applies nothing and reports skip as the
// policies it could not express.
type skippingBackend struct{ skip []dataplane.Skipped }

func (b *skippingBackend) Name() string { return "skipping" }
func (b *skippingBackend) Sync(context.Context, *policy.Ruleset) (dataplane.SyncResult, error) {
	return dataplane.SyncResult{Operations: 1, Skipped: b.skip}, nil
}
func (b *skippingBackend) FullSync(context.Context, *policy.Ruleset) (dataplane.SyncResult, error) {
	return dataplane.SyncResult{Full: true, Operations: 1, Skipped: b.skip}, nil
}
func (b *skippingBackend) Verify(context.Context) error  { return nil }
func (b *skippingBackend) Cleanup(context.Context) error { return nil }
func (b *skippingBackend) Render(*policy.Ruleset) string { return "" }

// TestSyncChangesStatusOnce checks that a sync tells the status what the kernel holds in one
// change: the Generation and Revision applied with the policies skipped in them, never the
// skipped list of a sync whose Generation is not there yet. A reader long-polling /status is
// woken by the change it waits for, not by a half of it a moment before (each needless wake
// costs the reader a round trip just as the answer it waits for is coming). Without a flow
// guard, the established-flows Generation follows in a second change.
func TestSyncChangesStatusOnce(t *testing.T) {
	st := cluster.NewState()
	st.Generation = 1
	src := &runningSource{state: st}
	be := &skippingBackend{skip: []dataplane.Skipped{{Policy: "a/one", Reason: "test"}}}
	a := New(Config{NodeName: "n", Source: src, NetworkPolicy: &NetworkPolicy{Backend: be}, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	if err := a.syncOnce(ctx, true, time.Time{}); err != nil {
		t.Fatal(err)
	}
	p, _, v := a.status.get()
	if p.Generation != 1 || len(p.Skipped) != 1 || p.Skipped[0].Policy != "a/one" {
		t.Fatalf("after the first sync: %+v", p)
	}

	next := cluster.NewState()
	next.Generation = 2
	next.Policies["a/two"] = &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "two"}}
	src.state = next
	be.skip = []dataplane.Skipped{{Policy: "a/two", Reason: "test"}}
	if err := a.syncOnce(ctx, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	p, _, v2 := a.status.get()
	if p.Generation != 2 || len(p.Skipped) != 1 || p.Skipped[0].Policy != "a/two" || p.EstablishedGeneration != 2 {
		t.Fatalf("after the second sync: %+v", p)
	}
	if v2-v != 2 {
		t.Errorf("the sync changed the status %d times, want 2 (the rules applied, then established flows)", v2-v)
	}
}
