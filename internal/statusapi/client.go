package statusapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Query chooses what a read of /status carries: each feature's Revision limited to the named
// Files (?file=NAME) and Resources (?resource=NAME), since the hashes of thousands of files a
// reader did not write would be megabytes of JSON per read. Each list trims only its own half
// of the Revision; a nil one keeps that half whole.
type Query struct {
	Files     []string
	Resources []string
}

// values spells q and, with poll, a long poll for a change from version after.
func (q Query) values(poll bool, after uint64, wait time.Duration) url.Values {
	v := url.Values{"file": q.Files, "resource": q.Resources}
	if poll {
		v.Set("after", strconv.FormatUint(after, 10))
		v.Set("wait", wait.String())
	}
	return v
}

// Client reads the /status of one agent's health server.
type Client struct {
	// Dial connects to the health server (the agent's --health-addr). Each read dials anew, so
	// a client outlives restarts of the agent.
	Dial func(ctx context.Context) (net.Conn, error)
}

// UnixClient reads the status the agent serves on the unix socket path (--health-addr
// unix:PATH): a reader outside the agent's network namespace reaches it too.
func UnixClient(path string) Client {
	return Client{Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
}

// Read GETs /status.
func (c Client) Read(q Query) (Status, error) { return c.get(q.values(false, 0, 0), 0) }

// ReadChanged GETs /status as a long poll (?after=VERSION&wait=DURATION): the agent answers once
// its status is no longer at version after (a caller may hold the version of an earlier process
// of the agent, so any other version counts), or when wait has run out.
func (c Client) ReadChanged(q Query, after uint64, wait time.Duration) (Status, error) {
	return c.get(q.values(true, after, wait), wait)
}

func (c Client) get(q url.Values, wait time.Duration) (Status, error) {
	var st Status
	hc := http.Client{Timeout: wait + 5*time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return c.Dial(ctx) },
	}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://agent/status?" + q.Encode())
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Wait reads the status until done holds, each read after the first a long poll answered when
// the status changes: it sees each change as soon as the agent makes it, without spending the
// agent's CPU on polls. query gives each read's Query (a caller's list of files may grow while it
// waits). abort, called after each read that done rejected, ends the wait with its error when
// it returns one (the agent exited). At the deadline, the error is a *DeadlineError.
func (c Client) Wait(deadline time.Time, query func() Query, done func(Status) bool, abort func() error) error {
	var last Status
	var seen *Status // the last status read, to wait for a change from
	var lastErr error
	for {
		var st Status
		var err error
		asked := time.Now()
		wait := min(time.Second, max(time.Until(deadline), 0)) // short enough to notice an abort or the deadline soon
		if seen == nil {
			st, err = c.Read(query())
		} else {
			st, err = c.ReadChanged(query(), seen.Version, wait)
			if err == nil && st.Version == seen.Version && time.Since(asked) < wait/2 {
				// An agent without the long poll (an older binary, measured side by side)
				// answers at once: poll it at the interval of old rather than spin.
				time.Sleep(250 * time.Microsecond)
			}
		}
		if err == nil && done(st) {
			return nil
		}
		last, lastErr = st, err
		if err == nil {
			seen = &last
		}
		if err := abort(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return &DeadlineError{Last: last, ReadErr: lastErr}
		}
		if err != nil {
			// Not serving yet (starting), or gone: a poll interval, not a guess at sync time.
			seen = nil
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// DeadlineError is a Wait that ran out: what it read last, for the caller's message.
type DeadlineError struct {
	Last    Status // the zero Status when the last read failed
	ReadErr error  // why the last read failed, or nil
}

func (e *DeadlineError) Error() string {
	return fmt.Sprintf("the agent's status did not reach the state waited for by the deadline (last read error %v)", e.ReadErr)
}
