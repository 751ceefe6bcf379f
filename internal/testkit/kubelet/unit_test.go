package kubelet

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
)

func TestIsAgnhost(t *testing.T) {
	for image, want := range map[string]bool{
		"registry.k8s.io/e2e-test-images/agnhost:2.53": true,
		"registry.k8s.io/e2e-test-images/agnhost":      true,
		"agnhost:2.53":                                    true,
		"localhost:5000/agnhost@sha256:0123":              true,
		"registry.k8s.io/e2e-test-images/agnhost-foo:1.0": false,
		"docker.io/library/nginx:1.27":                    false,
		"registry.k8s.io/pause:3.10":                      false,
		"agnhost.example.com:5000/busybox":                false,
	} {
		if got := isAgnhost(image); got != want {
			t.Errorf("isAgnhost(%q) = %v, want %v", image, got, want)
		}
	}
}

// TestContainerArgv checks Kubernetes' rules for command and args against the agnhost image's
// ENTRYPOINT ["/agnhost"] and CMD ["pause"], with $(VAR) expansion.
func TestContainerArgv(t *testing.T) {
	env := []corev1.EnvVar{{Name: "PORT", Value: "80"}, {Name: "NAME", Value: "web"}}
	for _, tc := range []struct {
		command, args, want []string
	}{
		{nil, nil, []string{"/agnhost", "pause"}},
		{nil, []string{"porter"}, []string{"/agnhost", "porter"}},
		{nil, []string{"serve-hostname", "--port", "$(PORT)"}, []string{"/agnhost", "serve-hostname", "--port", "80"}},
		{[]string{"/bin/sh", "-c", "echo $(NAME) $(MISSING) $$(NAME)"}, nil, []string{"/bin/sh", "-c", "echo web $(MISSING) $(NAME)"}},
		{[]string{"/agnhost"}, []string{"netexec", "--http-port=$(PORT)"}, []string{"/agnhost", "netexec", "--http-port=80"}},
	} {
		c := &corev1.Container{Command: tc.command, Args: tc.args}
		if got := containerArgv(c, env); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("command %q args %q: %q, want %q", tc.command, tc.args, got, tc.want)
		}
	}
}

func TestResolveEnv(t *testing.T) {
	pod := &corev1.Pod{}
	pod.Name, pod.Namespace, pod.Spec.NodeName, pod.UID = "web", "ns1", "node1", "uid-1"
	pod.Labels = map[string]string{"app": "x"}
	ref := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	c := &corev1.Container{Env: []corev1.EnvVar{
		{Name: "A", Value: "1"},
		{Name: "B", Value: "$(A)-2"},
		{Name: "POD", ValueFrom: ref("metadata.name")},
		{Name: "NS", ValueFrom: ref("metadata.namespace")},
		{Name: "NODE", ValueFrom: ref("spec.nodeName")},
		{Name: "IP", ValueFrom: ref("status.podIP")},
		{Name: "APP", ValueFrom: ref("metadata.labels['app']")},
	}}
	env, err := resolveEnv(context.Background(), nil, pod, c, []string{"10.0.0.5"}, []string{"10.1.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range env {
		got[e.Name] = e.Value
	}
	want := map[string]string{"A": "1", "B": "1-2", "POD": "web", "NS": "ns1", "NODE": "node1", "IP": "10.0.0.5", "APP": "x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("env %v, want %v", got, want)
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}})
	if _, err := resolveEnv(context.Background(), nil, pod, c, nil, nil); err == nil || !strings.Contains(err.Error(), "env CPU") {
		t.Errorf("unsupported resourceFieldRef: error %v, want one naming env CPU", err)
	}
}

func TestNetnsName(t *testing.T) {
	short := netnsNameFor("node1", "default", "web", "uid-1")
	if !strings.HasPrefix(short, "nwk-node1-default-web-") {
		t.Errorf("short name %q", short)
	}
	if other := netnsNameFor("node1", "default", "web", "uid-2"); other == short {
		t.Errorf("two UIDs, one name %q", short)
	}
	long := netnsNameFor("node1", strings.Repeat("n", 63), strings.Repeat("p", 253), "uid-1")
	if len(long) > 80 || !strings.HasPrefix(long, "nwk-node1-") {
		t.Errorf("long name %q (%d bytes)", long, len(long))
	}
	if long2 := netnsNameFor("node1", strings.Repeat("n", 63), strings.Repeat("p", 252)+"q", "uid-1"); long2 == long {
		t.Errorf("two long pod names, one netns name %q", long)
	}
}

// TestLogs writes a log as containers do and reads it back with the containerLogs options.
func TestLogs(t *testing.T) {
	dir := t.TempDir()
	lf, err := newLogFile(filepath.Join(dir, "0.log"))
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	lf.copyStream("stdout", outR)
	lf.copyStream("stderr", errR)
	lf.closeWhenDone()
	io.WriteString(outW, "one\ntwo\n")
	time.Sleep(20 * time.Millisecond)
	io.WriteString(errW, "three\n")
	time.Sleep(20 * time.Millisecond)

	read := func(opts api.ContainerLogOpts) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := readLogs(ctx, lf, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read(api.ContainerLogOpts{}); got != "one\ntwo\nthree\n" {
		t.Errorf("all: %q", got)
	}
	if got := read(api.ContainerLogOpts{Tail: 1}); got != "three\n" {
		t.Errorf("tail 1: %q", got)
	}
	if got := read(api.ContainerLogOpts{LimitBytes: 6}); got != "one\ntw" {
		t.Errorf("limitBytes 6: %q", got)
	}
	if got := read(api.ContainerLogOpts{Timestamps: true, Tail: 1}); !strings.HasSuffix(got, " three\n") || len(got) < 20 {
		t.Errorf("timestamps: %q", got)
	}
	if got := read(api.ContainerLogOpts{SinceTime: time.Now().Add(time.Hour)}); got != "" {
		t.Errorf("sinceTime in the future: %q", got)
	}

	// Follow: gets what is written later, a partial line included, and ends with the streams.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := readLogs(ctx, lf, api.ContainerLogOpts{Follow: true, Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	time.Sleep(150 * time.Millisecond)
	io.WriteString(outW, "four\nfi")
	time.Sleep(50 * time.Millisecond)
	outW.Close()
	errW.Close()
	select {
	case got := <-done:
		if got != "three\nfour\nfi" {
			t.Errorf("follow: %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow did not end with the streams")
	}
}
