package kubelet

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netwarden/netwarden/internal/testkit/testbed"
)

// NetNSDir is where pod network namespaces are named (as `ip netns` names them).
const NetNSDir = testbed.NetNSDir

// sandbox is what the containers of a pod share: network and UTS namespaces and a root
// filesystem.
type sandbox struct {
	// mu is held for reading while a process is forked into the sandbox, and for writing while
	// it is torn down: a fork never sees a closed namespace file or a half-unmounted rootfs.
	mu            sync.RWMutex
	released      bool // no process may start any more
	netnsRemoved  bool
	rootfsRemoved bool
	// The fields below do not change once the sandbox is shared.
	hostNetwork bool
	netnsName   string   // under NetNSDir; empty for hostNetwork pods
	netnsPath   string   // the pod's netns, or the node's for hostNetwork pods
	netns       *os.File // held open while the pod lives
	uts         *os.File // the UTS namespace lives as long as this is open: nothing to unmount
	rootfs      string
	cniRT       *libcni.RuntimeConf
	cniAdded    bool
	ips         []netip.Addr
}

// NetNSPath is where the daemon of node mounts the network namespace of a pod (not on the
// host network).
func NetNSPath(node, namespace, name, uid string) string {
	return filepath.Join(NetNSDir, netnsNameFor(node, namespace, name, uid))
}

// netnsNameFor names a pod's network namespace "nwk-<node>-<namespace>-<name>-<uid hash>",
// shortened with a hash to fit a file name that tools print readably. The UID's hash keeps a
// pod recreated under the same name (while the old one is still going away) apart.
func netnsNameFor(node, namespace, name, uid string) string {
	sum := sha256.Sum256([]byte(uid))
	suffix := "-" + hex.EncodeToString(sum[:3])
	base := "nwk-" + node + "-" + namespace + "-" + name
	const max = 80
	if len(base)+len(suffix) > max {
		full := sha256.Sum256([]byte(base))
		base = base[:max-len(suffix)-9] + "-" + hex.EncodeToString(full[:4])
	}
	return base + suffix
}

// newNamespaces creates the pod's network namespace bind-mounted at NetNSDir/name (unless name
// is empty: hostNetwork pods use the node's) and a UTS namespace with the given hostname. The
// calling thread's namespaces never change: the unshare happens on a throw-away OS thread.
func newNamespaces(name, hostname string) (netnsFile, utsFile *os.File, err error) {
	var path string
	if name != "" {
		if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
			return nil, nil, err
		}
		path = filepath.Join(NetNSDir, name)
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if errors.Is(err, os.ErrExist) {
			// The name carries the pod's UID: this one is left from a daemon that did not stop
			// (crashed) while running the same pod.
			if err := testbed.RemoveNetNSMount(path); err != nil {
				return nil, nil, fmt.Errorf("removing a stale netns of the same pod: %w", err)
			}
			f, err = os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("creating the netns file: %w", err)
		}
		f.Close()
	}
	type result struct {
		uts *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread is in new namespaces and ends with this goroutine.
		runtime.LockOSThread()
		flags := unix.CLONE_NEWUTS
		if path != "" {
			flags |= unix.CLONE_NEWNET
		}
		if err := unix.Unshare(flags); err != nil {
			ch <- result{err: fmt.Errorf("unshare: %w", err)}
			return
		}
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			ch <- result{err: fmt.Errorf("sethostname %q: %w", hostname, err)}
			return
		}
		task := fmt.Sprintf("/proc/self/task/%d/ns/", unix.Gettid())
		if path != "" {
			if err := unix.Mount(task+"net", path, "none", unix.MS_BIND, ""); err != nil {
				ch <- result{err: fmt.Errorf("bind-mounting the netns at %s: %w", path, err)}
				return
			}
		}
		uts, err := os.Open(task + "uts")
		ch <- result{uts: uts, err: err}
	}()
	r := <-ch
	if r.err == nil && path != "" {
		netnsFile, r.err = os.Open(path)
	}
	if r.err != nil {
		if r.uts != nil {
			r.uts.Close()
		}
		if path != "" {
			_ = testbed.RemoveNetNSMount(path)
		}
		return nil, nil, r.err
	}
	return netnsFile, r.uts, nil
}

// setLoopbackUp brings lo up in the pod's namespace, as a runtime's loopback CNI call would.
func setLoopbackUp(netnsFile *os.File) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(int(netnsFile.Fd())))
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

// hostDirs are bind-mounted read-only into every pod's root filesystem, so that /bin/sh,
// /bin/bash and their libraries are there as in the agnhost image. A symlink (/bin -> usr/bin
// on merged-/usr hosts) is copied as a symlink.
var hostDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// mountRootfs builds the pod's root filesystem at dir: a small tmpfs, made private so that
// nothing mounted below it propagates anywhere, holding the mount points of read-only binds of
// hostDirs, /sys and /dev, a bind of /proc, writable tmpfs /tmp and /dev/shm of the pod's own,
// the agnhost binary at /agnhost and the pod's /etc/hosts. Everything hangs below one mount: a lazy unmount
// of dir takes all of it away.
func mountRootfs(dir, agnhost, hostsFile string) (err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16m,mode=755"); err != nil {
		return fmt.Errorf("mounting the rootfs tmpfs at %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = unmountRootfs(dir)
		}
	}()
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s private: %w", dir, err)
	}
	bind := func(src, rel string, readOnly bool) error {
		dst := filepath.Join(dir, rel)
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		// The mount point is made only where there is none: /etc/hosts already exists in the
		// bind of the host's /etc, which must never be written through.
		if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
			if fi.IsDir() {
				err = os.MkdirAll(dst, 0o755)
			} else {
				var f *os.File
				if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755); err == nil {
					err = f.Close()
				}
			}
			if err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s at %s: %w", src, dst, err)
		}
		if readOnly {
			// A bind takes the flags of its source's mount; the remount must keep the locked
			// ones (nosuid, nodev, noexec) or the kernel refuses it.
			var st unix.Statfs_t
			flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
			if unix.Statfs(dst, &st) == nil {
				for _, f := range []struct{ st, ms int64 }{{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC}} {
					if st.Flags&f.st != 0 {
						flags |= uintptr(f.ms)
					}
				}
			}
			if err := unix.Mount("", dst, "", flags, ""); err != nil {
				return fmt.Errorf("remounting %s read-only: %w", dst, err)
			}
		}
		return nil
	}
	for _, d := range hostDirs {
		fi, err := os.Lstat(d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(d)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(dir, d)); err != nil {
				return err
			}
			continue
		}
		if err := bind(d, d, true); err != nil {
			return err
		}
	}
	for _, m := range []struct {
		src      string
		readOnly bool
	}{{"/proc", false}, {"/sys", true}, {"/dev", true}} {
		// /dev read-only still lets processes write to devices (the flag guards only regular
		// files and directories), and keeps the host's device nodes out of any delete.
		if err := bind(m.src, m.src, m.readOnly); err != nil {
			return err
		}
	}
	// The host's /dev/shm came with /dev: each pod gets its own.
	if fi, err := os.Stat(filepath.Join(dir, "dev", "shm")); err == nil && fi.IsDir() {
		if err := unix.Mount("shm", filepath.Join(dir, "dev", "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64m,mode=1777"); err != nil {
			return fmt.Errorf("mounting /dev/shm: %w", err)
		}
	}
	for _, d := range []string{"tmp", "root", "run", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", filepath.Join(dir, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64m,mode=1777"); err != nil {
		return fmt.Errorf("mounting /tmp: %w", err)
	}
	if err := bind(agnhost, "agnhost", true); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "etc", "hosts")); err == nil {
		if err := bind(hostsFile, "etc/hosts", true); err != nil {
			return err
		}
	}
	return nil
}

// unmountRootfs detaches the root filesystem and everything below it, then removes the mount
// point. A directory that is still a mount point stays (os.Remove fails with EBUSY): nothing
// below it is ever deleted, so a bind of a host directory cannot lose its files.
func unmountRootfs(dir string) error {
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		if err == nil {
			continue
		}
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		break
	}
	if mounted, err := mountsBelow(dir); err != nil {
		return err
	} else if len(mounted) > 0 {
		return fmt.Errorf("rootfs %s still has mounts after unmounting it: %s", dir, strings.Join(mounted, ", "))
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// mountsBelow lists the mount points at or below dir in this mount namespace.
func mountsBelow(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cniRuntimeConf is what libcni passes to the plugins for a pod, as a CRI runtime does.
func cniRuntimeConf(pod *corev1.Pod, netnsPath string) *libcni.RuntimeConf {
	type portMapping struct {
		HostPort      int32  `json:"hostPort"`
		ContainerPort int32  `json:"containerPort"`
		Protocol      string `json:"protocol"`
		HostIP        string `json:"hostIP,omitempty"`
	}
	maps := []portMapping{}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == 0 {
				continue
			}
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			maps = append(maps, portMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: proto, HostIP: p.HostIP})
		}
	}
	return &libcni.RuntimeConf{
		ContainerID: string(pod.UID),
		NetNS:       netnsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", string(pod.UID)},
			{"K8S_POD_UID", string(pod.UID)},
		},
		CapabilityArgs: map[string]any{"portMappings": maps},
	}
}

// cniAdd runs ADD with the plugins in the node's network namespace and returns the pod's IPs,
// those of the primary family first.
func (d *Daemon) cniAdd(ctx context.Context, rt *libcni.RuntimeConf) ([]netip.Addr, error) {
	var ips []netip.Addr
	err := ns.WithNetNSPath(d.cfg.NodeNetNS, func(ns.NetNS) error {
		res, err := d.cni.AddNetworkList(ctx, d.cniList, rt)
		if err != nil {
			return err
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			return fmt.Errorf("reading the CNI result: %w", err)
		}
		for _, ipc := range r.IPs {
			if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
				ips = append(ips, a.Unmap())
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI network %q returned no IP address", d.cniList.Name)
	}
	primary4 := d.cfg.NodeIPs[0].Is4()
	slices.SortStableFunc(ips, func(a, b netip.Addr) int {
		ka, kb := a.Is4() != primary4, b.Is4() != primary4
		switch {
		case ka == kb:
			return 0
		case !ka:
			return -1
		}
		return 1
	})
	return ips, nil
}

// cniDel runs DEL in the node's network namespace.
func (d *Daemon) cniDel(ctx context.Context, rt *libcni.RuntimeConf) error {
	return ns.WithNetNSPath(d.cfg.NodeNetNS, func(ns.NetNS) error {
		return d.cni.DelNetworkList(ctx, d.cniList, rt)
	})
}

var errSandboxGone = errors.New("the pod's sandbox is gone")

// start starts cmd in the sandbox: its namespaces, chrooted in its root filesystem.
func (sb *sandbox) start(s *spawner, cmd *exec.Cmd) error {
	sb.mu.RLock()
	defer sb.mu.RUnlock()
	if sb.released || sb.netns == nil || sb.uts == nil {
		return errSandboxGone
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &unix.SysProcAttr{}
	}
	cmd.SysProcAttr.Chroot = sb.rootfs
	return s.start(sb.netns, sb.uts, cmd)
}

// usable tells whether processes can still be started in the sandbox.
func (sb *sandbox) usable() bool {
	sb.mu.RLock()
	defer sb.mu.RUnlock()
	return !sb.released
}
