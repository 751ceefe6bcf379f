package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Volumes: emptyDir, configMap, secret, downwardAPI and projected (configMap, secret,
// downwardAPI, serviceAccountToken sources) are supported; their files are written once when
// the pod starts (no later updates). Each volume is a directory of the pod, bind-mounted into
// the pod's root filesystem at the mountPath of every container that mounts it: the containers
// of a pod share one root filesystem, so a volume mounted by one container is seen by all.
// Other volume types fail the pod's start with an error that names them.

// prepareVolumes writes the pod's volumes under dir/volumes and returns their directories by
// name.
func (p *podState) prepareVolumes(ctx context.Context, pod *corev1.Pod, podIPs, hostIPs []string) (map[string]string, error) {
	dirs := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(p.dir, "volumes", v.Name)
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o777); err != nil { // emptyDir is world-writable, as the kubelet makes it
			return nil, err
		}
		var files map[string]volumeFile
		var err error
		switch {
		case v.EmptyDir != nil:
		case v.ConfigMap != nil:
			files, err = p.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
		case v.Secret != nil:
			files, err = p.secretFiles(ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
		case v.DownwardAPI != nil:
			files, err = downwardFiles(pod, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode, podIPs, hostIPs)
		case v.Projected != nil:
			files, err = p.projectedFiles(ctx, pod, v.Projected, podIPs, hostIPs)
		default:
			err = errors.New("this volume type is not supported by this node (supported: emptyDir, configMap, secret, downwardAPI, projected)")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		for rel, f := range files {
			path := filepath.Join(dir, filepath.Clean("/"+rel))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(path, f.data, f.mode); err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			if err := os.Chmod(path, f.mode); err != nil {
				return nil, err
			}
		}
		dirs[v.Name] = dir
	}
	return dirs, nil
}

// mountVolumes binds the volumes at the containers' mountPaths in rootfs. The first container
// that mounts something at a path decides what is there.
func (p *podState) mountVolumes(pod *corev1.Pod, rootfs string, dirs map[string]string) error {
	readOnlyKinds := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		readOnlyKinds[v.Name] = v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil || v.Projected != nil
	}
	mounted := map[string]string{}
	all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range all {
		for _, m := range c.VolumeMounts {
			src, ok := dirs[m.Name]
			if !ok {
				return fmt.Errorf("container %s mounts volume %q, which the pod does not have", c.Name, m.Name)
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				sub := m.SubPath
				if sub == "" {
					sub = m.SubPathExpr // $(VAR) expansion of subPathExpr is not done
				}
				rel := filepath.Clean("/" + sub)
				if err := noSymlinks(src, rel); err != nil {
					return fmt.Errorf("container %s: subPath %q of volume %q: %w", c.Name, sub, m.Name, err)
				}
				src = filepath.Join(src, rel)
				if err := os.MkdirAll(src, 0o777); err != nil {
					return err
				}
			}
			target := filepath.Clean("/" + m.MountPath)
			if prev, ok := mounted[target]; ok {
				if prev != src {
					p.logf("container %s: %s is already mounted from another volume; the containers of a pod share one root filesystem", c.Name, target)
				}
				continue
			}
			// A symlink on the way would be followed from the host's root, not the pod's.
			if err := noSymlinks(rootfs, target); err != nil {
				return fmt.Errorf("container %s: mountPath %s: %w", c.Name, target, err)
			}
			dst := filepath.Join(rootfs, target)
			if err := makeMountPoint(src, dst); err != nil {
				return fmt.Errorf("container %s: mount point %s for volume %q: %w (the host's directories in the root filesystem are read-only)", c.Name, target, m.Name, err)
			}
			if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("container %s: mounting volume %q at %s: %w", c.Name, m.Name, target, err)
			}
			if m.ReadOnly || readOnlyKinds[m.Name] {
				if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
					return fmt.Errorf("container %s: remounting volume %q at %s read-only: %w", c.Name, m.Name, target, err)
				}
			}
			mounted[target] = src
		}
	}
	return nil
}

// noSymlinks fails when a component of rel that exists under base is a symlink.
func noSymlinks(base, rel string) error {
	p := base
	for _, part := range strings.Split(strings.Trim(rel, "/"), "/") {
		if part == "" {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink: not supported on the way to a mount", strings.TrimPrefix(p, base))
		}
	}
	return nil
}

func makeMountPoint(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	if fi.IsDir() {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

type volumeFile struct {
	data []byte
	mode os.FileMode
}

func fileMode(item, def *int32, fallback os.FileMode) os.FileMode {
	switch {
	case item != nil:
		return os.FileMode(*item) & 0o777
	case def != nil:
		return os.FileMode(*def) & 0o777
	}
	return fallback
}

// keyFiles maps data to files: every key, or the listed items only.
func keyFiles(what string, data map[string][]byte, items []corev1.KeyToPath, defMode *int32) (map[string]volumeFile, error) {
	out := map[string]volumeFile{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = volumeFile{v, fileMode(nil, defMode, 0o644)}
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		out[it.Path] = volumeFile{v, fileMode(it.Mode, defMode, 0o644)}
	}
	return out, nil
}

func (p *podState) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, defMode *int32) (map[string]volumeFile, error) {
	cm, err := p.d.cfg.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil, nil
		}
		return nil, fmt.Errorf("configMap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles("configMap "+name, data, items, defMode)
}

func (p *podState) secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, defMode *int32) (map[string]volumeFile, error) {
	s, err := p.d.cfg.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil, nil
		}
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return keyFiles("secret "+name, s.Data, items, defMode)
}

func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, defMode *int32, podIPs, hostIPs []string) (map[string]volumeFile, error) {
	out := map[string]volumeFile{}
	for _, it := range items {
		if it.FieldRef == nil {
			return nil, fmt.Errorf("downwardAPI item %q: only fieldRef is supported", it.Path)
		}
		var v string
		switch it.FieldRef.FieldPath {
		case "metadata.labels":
			v = formatMap(pod.Labels)
		case "metadata.annotations":
			v = formatMap(pod.Annotations)
		default:
			var err error
			v, err = envValueFrom(context.Background(), nil, pod, corev1.EnvVar{ValueFrom: &corev1.EnvVarSource{FieldRef: it.FieldRef}}, podIPs, hostIPs)
			if err != nil {
				return nil, fmt.Errorf("downwardAPI item %q: %w", it.Path, err)
			}
		}
		out[it.Path] = volumeFile{[]byte(v), fileMode(it.Mode, defMode, 0o644)}
	}
	return out, nil
}

// formatMap writes labels or annotations as the kubelet does: key="value" lines, sorted.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

func (p *podState) projectedFiles(ctx context.Context, pod *corev1.Pod, pv *corev1.ProjectedVolumeSource, podIPs, hostIPs []string) (map[string]volumeFile, error) {
	out := map[string]volumeFile{}
	merge := func(files map[string]volumeFile) {
		for k, v := range files {
			out[k] = v
		}
	}
	for _, src := range pv.Sources {
		switch {
		case src.ConfigMap != nil:
			files, err := p.configMapFiles(ctx, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, pv.DefaultMode)
			if err != nil && src.ConfigMap.Name == "kube-root-ca.crt" {
				// Published by kube-controller-manager, which a test cluster may not run: the
				// service-account volume still gets its token and namespace.
				p.logf("projected volume: %v (skipped)", err)
				continue
			}
			if err != nil {
				return nil, err
			}
			merge(files)
		case src.Secret != nil:
			files, err := p.secretFiles(ctx, pod.Namespace, src.Secret.Name, src.Secret.Items, src.Secret.Optional, pv.DefaultMode)
			if err != nil {
				return nil, err
			}
			merge(files)
		case src.DownwardAPI != nil:
			files, err := downwardFiles(pod, src.DownwardAPI.Items, pv.DefaultMode, podIPs, hostIPs)
			if err != nil {
				return nil, err
			}
			merge(files)
		case src.ServiceAccountToken != nil:
			sat := src.ServiceAccountToken
			exp := int64(3600)
			if sat.ExpirationSeconds != nil {
				exp = *sat.ExpirationSeconds
			}
			var aud []string
			if sat.Audience != "" {
				aud = []string{sat.Audience}
			}
			sa := pod.Spec.ServiceAccountName
			if sa == "" {
				sa = "default"
			}
			tr, err := p.d.cfg.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{
					Audiences: aud, ExpirationSeconds: &exp,
					BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				return nil, fmt.Errorf("token of service account %q: %w", sa, err)
			}
			out[sat.Path] = volumeFile{[]byte(tr.Status.Token), fileMode(nil, pv.DefaultMode, 0o644)}
		default:
			return nil, errors.New("projected source not supported (supported: configMap, secret, downwardAPI, serviceAccountToken)")
		}
	}
	return out, nil
}
