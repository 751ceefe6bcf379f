// Package gateproto is the contract on the agent's gate socket: the netwarden-gate CNI plugin
// (internal/cni/gate) is the client, sending one pod attachment's verb with Call, and the node's
// agent (internal/agent, gate.go) the server, reading it with ReadRequest and answering with
// WriteResponse. It imports only the standard library, so the agent serves the socket without
// linking the CNI libraries the plugin is built on.
//
// The protocol is one JSON request and one JSON response per connection, each a line.
package gateproto

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// DefaultSocket is where the agent listens when its flag is left alone, and where the plugin
// connects when its config names no socket.
const DefaultSocket = "/run/netwarden/gate.sock"

// Verbs of a Request.
const (
	VerbAdd    = "ADD"    // register a pod and wait until its verdicts are installed
	VerbDel    = "DEL"    // forget an attachment
	VerbCheck  = "CHECK"  // is the pod's attachment registered and its verdicts installed?
	VerbGC     = "GC"     // forget every attachment but Valid
	VerbStatus = "STATUS" // is the agent ready to admit pods?
)

// Attachment identifies one CNI attachment.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// Request is what the plugin asks.
type Request struct {
	Verb string `json:"verb"`
	Attachment
	Namespace string   `json:"namespace,omitempty"`
	Name      string   `json:"name,omitempty"`
	IPs       []string `json:"ips,omitempty"`
	// Valid lists the attachments GC keeps.
	Valid []Attachment `json:"valid,omitempty"`
}

// Response is the agent's answer; Error is empty on success.
type Response struct {
	Error string `json:"error,omitempty"`
	// Isolated tells, after ADD, whether some policy selects the pod (for the log).
	Isolated bool `json:"isolated,omitempty"`
}

// Call sends req to the agent at socket and waits for its response until ctx is done.
func Call(ctx context.Context, socket string, req Request) (Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return Response{}, fmt.Errorf("connecting to the netwarden agent at %s: %w", socket, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	// A cancelled ctx without a deadline still ends the wait.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	b, _ := json.Marshal(req) // plain strings and slices always marshal
	if _, err := c.Write(append(b, '\n')); err != nil {
		return Response{}, fmt.Errorf("netwarden agent at %s: %w", socket, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		var ne net.Error
		if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return Response{}, fmt.Errorf("netwarden agent at %s: no answer: %w", socket, context.DeadlineExceeded)
		}
		return Response{}, fmt.Errorf("netwarden agent at %s: %w", socket, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("netwarden agent at %s: bad answer: %w", socket, err)
	}
	return resp, nil
}

// ReadRequest reads one request from an agent-side connection.
func ReadRequest(r *bufio.Reader) (Request, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return Request{}, err
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		return Request{}, fmt.Errorf("gate request: %w", err)
	}
	return req, nil
}

// WriteResponse writes one response to an agent-side connection.
func WriteResponse(w net.Conn, resp Response) error {
	b, _ := json.Marshal(resp)
	_, err := w.Write(append(b, '\n'))
	return err
}
