package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The agnhost image's ENTRYPOINT and CMD, against which container commands are built.
var (
	agnhostEntrypoint = []string{"/agnhost"}
	agnhostCmd        = []string{"pause"}
)

// defaultPath is the PATH of a container that sets none (the image's).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// isAgnhost tells whether image is agnhost: its last path element, without tag or digest, is
// "agnhost" (registry.k8s.io/e2e-test-images/agnhost:2.53).
func isAgnhost(image string) bool {
	return path.Base(imageRepo(image)) == "agnhost"
}

// imageRepo is image without its tag or digest.
func imageRepo(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

func unsupportedImageMessage(image string) string {
	return fmt.Sprintf("image %q cannot run on this node: it runs no container engine, only the agnhost image "+
		"(an image whose name ends in /agnhost, e.g. registry.k8s.io/e2e-test-images/agnhost:2.53), from a local agnhost binary", image)
}

// containerArgv builds the command line by Kubernetes' rules against the image's ENTRYPOINT and
// CMD: command replaces ENTRYPOINT (and drops CMD), args replace CMD. $(VAR) references are
// expanded with the container's environment.
func containerArgv(c *corev1.Container, env []corev1.EnvVar) []string {
	lookup := envMapping(env)
	var argv []string
	switch {
	case len(c.Command) > 0:
		argv = append(expandAll(c.Command, lookup), expandAll(c.Args, lookup)...)
	case len(c.Args) > 0:
		argv = append(append([]string{}, agnhostEntrypoint...), expandAll(c.Args, lookup)...)
	default:
		argv = append(append([]string{}, agnhostEntrypoint...), agnhostCmd...)
	}
	return argv
}

// resolveEnv computes a container's environment: envFrom, then env in order, with $(VAR)
// references to earlier variables expanded, and valueFrom resolved: fieldRef for the pod's
// metadata and the fields the daemon knows (pod and host IPs, node and service account
// names), configMapKeyRef and secretKeyRef through the API. Anything else is an error that
// names the variable.
func resolveEnv(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, c *corev1.Container, podIPs, hostIPs []string) ([]corev1.EnvVar, error) {
	var env []corev1.EnvVar
	set := func(name, value string) {
		for i := range env {
			if env[i].Name == name {
				env[i].Value = value
				return
			}
		}
		env = append(env, corev1.EnvVar{Name: name, Value: value})
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
					continue
				}
				return nil, fmt.Errorf("envFrom configMap %q: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
					continue
				}
				return nil, fmt.Errorf("envFrom secret %q: %w", from.SecretRef.Name, err)
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		default:
			return nil, errors.New("envFrom entry with neither configMapRef nor secretRef is not supported")
		}
		for k, v := range data {
			set(from.Prefix+k, v)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, envMapping(env)))
			continue
		}
		v, err := envValueFrom(ctx, client, pod, e, podIPs, hostIPs)
		if errors.Is(err, errOptionalMissing) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		set(e.Name, v)
	}
	return env, nil
}

var errOptionalMissing = errors.New("optional source missing")

func envValueFrom(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, e corev1.EnvVar, podIPs, hostIPs []string) (string, error) {
	vf := e.ValueFrom
	first := func(s []string) string {
		if len(s) == 0 {
			return ""
		}
		return s[0]
	}
	switch {
	case vf.FieldRef != nil:
		fp := vf.FieldRef.FieldPath
		switch fp {
		case "metadata.name":
			return pod.Name, nil
		case "metadata.namespace":
			return pod.Namespace, nil
		case "metadata.uid":
			return string(pod.UID), nil
		case "spec.nodeName":
			return pod.Spec.NodeName, nil
		case "spec.serviceAccountName":
			return pod.Spec.ServiceAccountName, nil
		case "status.podIP":
			return first(podIPs), nil
		case "status.podIPs":
			return strings.Join(podIPs, ","), nil
		case "status.hostIP":
			return first(hostIPs), nil
		case "status.hostIPs":
			return strings.Join(hostIPs, ","), nil
		}
		for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
			if rest, ok := strings.CutPrefix(fp, prefix+"['"); ok && strings.HasSuffix(rest, "']") {
				return m[strings.TrimSuffix(rest, "']")], nil
			}
		}
		return "", fmt.Errorf("fieldRef %q is not supported (supported: metadata.name, metadata.namespace, metadata.uid, "+
			"metadata.labels['...'], metadata.annotations['...'], spec.nodeName, spec.serviceAccountName, "+
			"status.podIP(s), status.hostIP(s))", fp)
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", errOptionalMissing
			}
			return "", fmt.Errorf("configMap %q: %w", ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional {
				return "", errOptionalMissing
			}
			return "", fmt.Errorf("configMap %q has no key %q", ref.Name, ref.Key)
		}
		return v, nil
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", errOptionalMissing
			}
			return "", fmt.Errorf("secret %q: %w", ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional {
				return "", errOptionalMissing
			}
			return "", fmt.Errorf("secret %q has no key %q", ref.Name, ref.Key)
		}
		return string(v), nil
	case vf.ResourceFieldRef != nil:
		return "", fmt.Errorf("resourceFieldRef %q is not supported", vf.ResourceFieldRef.Resource)
	}
	return "", errors.New("valueFrom with no source set is not supported")
}

func envMapping(env []corev1.EnvVar) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- {
			if env[i].Name == name {
				return env[i].Value, true
			}
		}
		return "", false
	}
}

func expandAll(in []string, lookup func(string) (string, bool)) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expand(s, lookup)
	}
	return out
}

// expand replaces $(VAR) with VAR's value, as Kubernetes does in env values, command and args:
// an undefined reference stays as written, and $$ escapes a $.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// processEnv is the environment a container's processes get: the image's PATH and HOSTNAME as a
// runtime sets them, then the container's own variables.
func processEnv(env []corev1.EnvVar, hostname string) []string {
	out := []string{"PATH=" + defaultPath, "HOSTNAME=" + hostname, "HOME=/root"}
	for _, e := range env {
		out = append(out, e.Name+"="+e.Value)
	}
	return out
}

// lookPathIn finds argv0 as the container would: a name without a slash is looked up in PATH
// (from env, else the image's) inside rootfs. The result is the path inside rootfs.
func lookPathIn(rootfs, argv0 string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	pathVar := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, argv0)
		if fi, err := os.Stat(filepath.Join(rootfs, p)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH %s", argv0, pathVar)
}
