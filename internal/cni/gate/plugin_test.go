package gate

import (
	"strings"
	"testing"
	"time"

	"github.com/netwarden/netwarden/internal/gateproto"
)

// TestParseConf: a malformed config is refused with an error naming the field.
func TestParseConf(t *testing.T) {
	for _, tc := range []struct {
		conf, field string
	}{
		{`{"cniVersion":"1.1.0","name":"n","type":"netwarden-gate","timeout":"soon"}`, "timeout"},
		{`{"cniVersion":"1.1.0","name":"n","type":"netwarden-gate","timeout":"-1s"}`, "timeout"},
		{`{"cniVersion":"1.1.0","name":"n","type":"netwarden-gate","socket":"run/gate.sock"}`, "socket"},
		{`{"cniVersion":"1.1.0","name":"n","type":"netwarden-gate","prevResult":{"cniVersion":"1.1.0","ips":[{"address":"nope"}]}}`, "prevResult"},
		{`{"cniVersion":"1.1.0","name":"n","type":"netwarden-gate","timeout":5}`, "timeout"},
	} {
		_, err := ParseConf([]byte(tc.conf))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, want an error naming %s", tc.conf, err, tc.field)
		}
	}
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"netwarden-gate","timeout":"250ms"}`))
	if err != nil || c.timeout != 250*time.Millisecond || c.Socket != gateproto.DefaultSocket {
		t.Errorf("got %+v, %v; want timeout 250ms on the default socket", c, err)
	}
	if _, err := c.attachmentIPs(); err == nil || !strings.Contains(err.Error(), "prevResult") {
		t.Errorf("no prevResult: got %v, want an error naming prevResult", err)
	}
}

// TestPodArgs: the pod's namespace and name come from CNI_ARGS, and a missing one is named.
func TestPodArgs(t *testing.T) {
	ns, name, err := podArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc")
	if err != nil || ns != "x" || name != "web-0" {
		t.Errorf("got %q %q %v", ns, name, err)
	}
	if _, _, err := podArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=x"); err == nil || !strings.Contains(err.Error(), "K8S_POD_NAME") {
		t.Errorf("missing name: got %v", err)
	}
}
