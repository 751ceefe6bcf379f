package simnode

import (
	"bytes"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/statusapi"
)

// PodObject builds a running Pod object with the given IPs.
func PodObject(namespace, name, node string, labels map[string]string, ips []netip.Addr, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "example.invalid/server", Ports: ports}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0].String()
	}
	return p
}

// Namespace builds a Namespace object.
func Namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}
}

// Marshal renders objects as one multi-document YAML stream.
func Marshal(objs ...runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// WriteFile atomically replaces file name in the manifests directory, so the agent never
// reads a half-written file. WaitApplied then waits for this content.
func (s *Sim) WriteFile(name string, data []byte) error {
	tmp := filepath.Join(s.Dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, name)); err != nil {
		return err
	}
	s.mu.Lock()
	s.wrote[name] = statusapi.ContentHash(data)
	s.mu.Unlock()
	return nil
}

// RemoveFile removes file name from the manifests directory. WaitApplied then waits for the
// agent to have applied a state without it.
func (s *Sim) RemoveFile(name string) error {
	if err := os.Remove(filepath.Join(s.Dir, name)); err != nil {
		return err
	}
	s.mu.Lock()
	s.wrote[name] = ""
	s.mu.Unlock()
	return nil
}

// Written returns the files this Sim wrote, each with the ContentHash of its latest content
// ("" once removed), for checking another agent's status with Covers.
func (s *Sim) Written() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.wrote)
}

// SetState writes the whole cluster state as one file, so the agent sees each step as one change.
func (s *Sim) SetState(objs ...runtime.Object) error {
	data, err := Marshal(objs...)
	if err != nil {
		return err
	}
	return s.WriteFile("cluster.yaml", data)
}

// Apply writes the state and waits for the agent to apply it.
func (s *Sim) Apply(objs ...runtime.Object) error {
	if err := s.SetState(objs...); err != nil {
		return err
	}
	return s.WaitApplied(15 * time.Second)
}
