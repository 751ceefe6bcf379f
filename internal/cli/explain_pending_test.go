package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runExplain runs the explain command with args and returns what it printed.
func runExplain(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := explainCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// verdicts keeps the lines of explain's output that judge, with the addresses taken out.
func verdicts(out string) string {
	var keep []string
	addr := regexp.MustCompile(` \([0-9a-f.:]+\)`)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  egress:") || strings.HasPrefix(l, "  ingress:") || strings.HasPrefix(l, "  verdict:") {
			keep = append(keep, addr.ReplaceAllString(l, ""))
		}
	}
	return strings.Join(keep, "\n")
}

// TestExplainBeforePodsHaveAddresses: the README's example asks about pods whose manifests carry
// no address (they get one when they run). explain judges them by namespace, labels and ports
// at stand-in addresses, and for every pair and port its verdicts are those of the same pods
// once they run with real addresses (exampleState).
func TestExplainBeforePodsHaveAddresses(t *testing.T) {
	const dir = "../../examples/manifests"
	running := exampleState(t)
	pods := []string{"frontend/web", "backend/api", "backend/db", "monitoring/prometheus"}
	for _, from := range pods {
		for _, to := range pods {
			for _, port := range []string{"80/tcp", "81/tcp", "5432/tcp"} {
				if from == to {
					continue
				}
				out, err := runExplain(t, "--manifests", dir, "--from", from, "--to", to, "--port", port)
				if err != nil {
					t.Fatalf("%s -> %s %s: %v\n%s", from, to, port, err, out)
				}
				if !strings.Contains(out, from+" has no address yet: judged by its namespace, labels and ports, at stand-in address 192.0.2.") {
					t.Fatalf("%s -> %s: explain does not say it judges %s at a stand-in address:\n%s", from, to, from, out)
				}
				src, _ := resolveEndpoint(running, "--from", from)
				dst, _ := resolveEndpoint(running, "--to", to)
				proto, n, _ := parsePortProto(port)
				var want bytes.Buffer
				if err := explain(&want, running, src, dst, proto, n); err != nil {
					t.Fatal(err)
				}
				// The running pods have both families: the first family's lines are one pass.
				wantV := verdicts(want.String())
				wantV = strings.Join(strings.Split(wantV, "\n")[:3], "\n")
				if got := verdicts(out); got != wantV {
					t.Errorf("%s -> %s %s before the pods run:\n%s\nonce they run:\n%s", from, to, port, got, wantV)
				}
			}
		}
	}
}

// TestExplainPodManifestFile: --from and --to take a Pod manifest that is not applied yet; it is
// judged as a pod of its namespace with its labels, and a rule naming addresses is pointed
// out as one its real address could meet differently.
func TestExplainPodManifestFile(t *testing.T) {
	dir := exampleManifests(t)
	pod := filepath.Join(t.TempDir(), "web2.yaml")
	if err := os.WriteFile(pod, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: web2, namespace: frontend, labels: {app: web}}\nspec: {containers: [{name: c, image: x}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	web, err := runExplain(t, "--manifests", dir, "--from", "frontend/web", "--to", "backend/api", "--port", "80/tcp")
	if err != nil {
		t.Fatal(err)
	}
	web2, err := runExplain(t, "--manifests", dir, "--from", pod, "--to", "backend/api", "--port", "80/tcp")
	if err != nil {
		t.Fatalf("%v\n%s", err, web2)
	}
	if !strings.Contains(web2, "frontend/web2 has no address yet") ||
		verdicts(strings.ReplaceAll(web2, "frontend/web2", "frontend/web")) != verdicts(web) || !strings.Contains(web2, "verdict: allowed") {
		t.Fatalf("a pod manifest like frontend/web is not judged as frontend/web:\n%s\nfrontend/web:\n%s", web2, web)
	}

	// A rule naming addresses: its verdict for a pod without one is marked as depending on it.
	ipBlock := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db-from-office, namespace: backend}\n" +
		"spec: {podSelector: {matchLabels: {app: db}}, ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24}}]}]}\n"
	if err := os.WriteFile(filepath.Join(dir, "office.yaml"), []byte(ipBlock), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runExplain(t, "--manifests", dir, "--from", pod, "--to", "backend/db", "--port", "80/tcp")
	if err != nil || !strings.Contains(out, "(frontend/web2 has no address yet: rules of NetworkPolicy backend/db-from-office name addresses (ipBlock, networks), so this verdict may change with the address it gets)") {
		t.Fatalf("the ipBlock rule is not pointed out: %v\n%s", err, out)
	}

	// What is not one Pod is refused, naming the file.
	if out, err := runExplain(t, "--manifests", dir, "--from", filepath.Join(dir, "office.yaml"), "--to", "backend/db", "--port", "80/tcp"); err == nil ||
		!strings.Contains(err.Error(), "office.yaml: want a manifest of one Pod") {
		t.Errorf("a NetworkPolicy file as --from: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: frontend}\nspec: {containers: [{name: c, ports: [{containerPort: 70000}]}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runExplain(t, "--manifests", dir, "--from", bad, "--to", "backend/db", "--port", "80/tcp"); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("an invalid Pod file as --from: %v\n%s", err, out)
	}
}
