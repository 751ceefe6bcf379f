package demo

import (
	"fmt"
	"os"
	"slices"

	"sigs.k8s.io/yaml"
)

// ExpectedVerdictsFile, in the examples directory, holds the verdict the demo must probe for
// every pair of pods once the example policies apply.
const ExpectedVerdictsFile = "expected-verdicts.yaml"

// VerdictKey names one probe of the demo's matrix: TCP from one pod to another on a port.
type VerdictKey struct {
	From, To string // namespace/name
	Port     uint16
}

// expectedVerdict is one entry of the expected-verdicts file.
type expectedVerdict struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Port    uint16 `json:"port"`
	Verdict string `json:"verdict"`
}

// LoadExpected reads the expected-verdicts file: whether each pair of pods may connect (true)
// or not. It must name every ordered pair of distinct pods on every port exactly once, so a
// pod or port added to the example without a verdict is an error, not a silent pass.
func LoadExpected(path string, pods []string, ports []uint16) (map[VerdictKey]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("expected verdicts: %w", err)
	}
	var entries []expectedVerdict
	if err := yaml.UnmarshalStrict(data, &entries); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	want := map[VerdictKey]bool{}
	for i, e := range entries {
		where := fmt.Sprintf("%s: item %d (%s -> %s port %d)", path, i, e.From, e.To, e.Port)
		switch {
		case !slices.Contains(pods, e.From):
			return nil, fmt.Errorf("%s: from: no pod %q in the example cluster", where, e.From)
		case !slices.Contains(pods, e.To):
			return nil, fmt.Errorf("%s: to: no pod %q in the example cluster", where, e.To)
		case e.From == e.To:
			return nil, fmt.Errorf("%s: a pod's traffic to itself is not probed", where)
		case !slices.Contains(ports, e.Port):
			return nil, fmt.Errorf("%s: port: the demo probes ports %v only", where, ports)
		case e.Verdict != "allowed" && e.Verdict != "denied":
			return nil, fmt.Errorf("%s: verdict: %q is neither allowed nor denied", where, e.Verdict)
		}
		k := VerdictKey{e.From, e.To, e.Port}
		if _, dup := want[k]; dup {
			return nil, fmt.Errorf("%s: a second verdict for this pair", where)
		}
		want[k] = e.Verdict == "allowed"
	}
	for _, from := range pods {
		for _, to := range pods {
			for _, port := range ports {
				if _, ok := want[VerdictKey{from, to, port}]; from != to && !ok {
					return nil, fmt.Errorf("%s: no verdict for %s -> %s port %d", path, from, to, port)
				}
			}
		}
	}
	return want, nil
}

func verdictWord(open bool) string {
	if open {
		return "ok"
	}
	return "denied"
}
