// Package image_test builds the netwarden image as `make image` does, unpacks it into a root file
// system and runs its tools and the agent from it, chrooted in a network namespace of the test's
// own; and checks that building twice gives the same digest.
package image_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/netwarden/netwarden/internal/image"
	"github.com/netwarden/netwarden/internal/testkit/kerneltest"
)

const maxCompressed = 40 << 20

func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}

func config(t testing.TB) image.Config {
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return image.Config{
		Archs:    []string{"amd64"},
		Version:  "image-test",
		Source:   repoRoot(t),
		CacheDir: filepath.Join(cache, "netwarden-image"),
		Created:  time.Unix(1700000000, 0),
	}
}

var built struct {
	once sync.Once
	idx  v1.ImageIndex
	imgs []v1.Image
	err  error
}

// build builds the image once for every test of the package.
func build(t testing.TB) (v1.ImageIndex, v1.Image) {
	t.Helper()
	built.once.Do(func() {
		built.idx, built.imgs, built.err = image.Build(context.Background(), config(t))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.idx, built.imgs[0]
}

func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("cannot run in CI: %s", why)
	}
	t.Skipf("skipping: %s", why)
}

// TestReproducible builds the image a second time, binaries included, and wants the same digests,
// and a compressed size within the target.
func TestReproducible(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		skipOrFail(t, "needs apt-get and dpkg-deb (a Debian host)")
	}
	idx, img := build(t)
	idx2, imgs2, err := image.Build(context.Background(), config(t))
	if err != nil {
		t.Fatal(err)
	}
	d1, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	d2, err := idx2.Digest()
	if err != nil {
		t.Fatal(err)
	}
	i1, _ := img.Digest()
	i2, _ := imgs2[0].Digest()
	if d1 != d2 || i1 != i2 {
		t.Fatalf("two builds from the same inputs differ: index %s and %s, image %s and %s", d1, d2, i1, i2)
	}
	size, err := image.CompressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("index %s, image %s, %.1f MiB compressed", d1, i1, float64(size)/(1<<20))
	if size > maxCompressed {
		t.Errorf("image is %.1f MiB compressed, over the %d MiB target", float64(size)/(1<<20), maxCompressed>>20)
	}
}

// extract unpacks img's flattened file system into dir.
func extract(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("image entry %q escapes the root", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
			if err == nil {
				err = os.Chmod(p, h.FileInfo().Mode())
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, h.FileInfo().Mode().Perm()); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		default:
			err = fmt.Errorf("unexpected type %c", h.Typeflag)
		}
		if err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}

// chrooted runs argv inside root, in the calling thread's network namespace.
func chrooted(t *testing.T, root string, argv ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func host(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

const clusterState = `apiVersion: v1
kind: Node
metadata: {name: node-a}
spec:
  podCIDRs: ["10.244.1.0/24"]
status:
  addresses: [{type: InternalIP, address: 192.168.0.10}]
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: shop, labels: {app: db}}
spec:
  nodeName: node-a
  containers: [{name: db, image: postgres, ports: [{name: sql, containerPort: 5432}]}]
status:
  podIP: 10.244.1.7
---
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: shop, labels: {app: api}}
spec:
  nodeName: node-b
  containers: [{name: api, image: api}]
status:
  podIP: 10.244.2.9
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-api, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: api}}}]
    ports: [{port: sql}]
`

// TestImageRuns unpacks the image and runs, chrooted into it inside a fresh network namespace,
// every tool the agent and the DaemonSet use, the DaemonSet's init script, and the agent once
// per backend; the rules it leaves are read with the host's own nft.
func TestImageRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "chroot and network namespaces need root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		skipOrFail(t, "needs apt-get and dpkg-deb (a Debian host)")
	}
	_, img := build(t)
	root := t.TempDir()
	extract(t, img, root)

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	ds := daemonSet(t)
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != image.Entrypoint {
		t.Errorf("entrypoint %v, want [%s]", got, image.Entrypoint)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if len(c.Command) > 0 {
			t.Errorf("container %s overrides the image's entrypoint with %v", c.Name, c.Command)
		}
		if u := c.SecurityContext.RunAsUser; u == nil || fmt.Sprint(*u) != cf.Config.User {
			t.Errorf("container %s runs as %v, the image as user %q", c.Name, u, cf.Config.User)
		}
	}

	// The agent's iptables backend reads /proc/net (per network namespace, so this proc shows the
	// test's namespace to the processes in it).
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o555); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("proc", filepath.Join(root, "proc"), "proc", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(filepath.Join(root, "proc"), syscall.MNT_DETACH)

	// A container runtime gives every container these device nodes (the agent's nft runs with
	// stdin from /dev/null); the image itself ships no /dev.
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, minor := range map[string]int{"null": 3, "zero": 5, "urandom": 9} {
		if err := syscall.Mknod(filepath.Join(root, "dev", name), syscall.S_IFCHR|0o666, 1<<8|minor); err != nil {
			t.Fatal(err)
		}
	}

	kerneltest.InFreshNetNS(t, func() {
		for _, c := range []struct {
			argv []string
			want string
		}{
			{[]string{image.Entrypoint, "version"}, "image-test"},
			{[]string{"nft", "--version"}, `nftables v\d`},
			{[]string{"iptables", "--version"}, `iptables v\d\S* \(nf_tables\)`},
			{[]string{"ip6tables-nft", "--version"}, `ip6tables v\d\S* \(nf_tables\)`},
			{[]string{"iptables-legacy", "--version"}, `iptables v\d\S* \(legacy\)`},
			{[]string{"ip6tables-legacy-save", "--version"}, `ip6tables-save v\d\S* \(legacy\)`},
			{[]string{"ipset", "--version"}, `ipset v\d`},
			{[]string{"conntrack", "--version"}, `conntrack v\d`},
			// Real work through the shared libraries and the dlopened extensions, not only the
			// version banner.
			{[]string{"iptables-legacy", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"}, ``},
			{[]string{"iptables-legacy-save", "-t", "filter"}, `-A INPUT -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -j ACCEPT`},
			{[]string{"ipset", "create", "probe", "hash:ip"}, ``},
			{[]string{"ipset", "list", "-n"}, `probe`},
			{[]string{"conntrack", "-L"}, `0 flow entries`},
		} {
			out, err := chrooted(t, root, c.argv...)
			if err != nil {
				t.Errorf("%s: %v\n%s", strings.Join(c.argv, " "), err, out)
				continue
			}
			if !regexp.MustCompile(c.want).MatchString(out) {
				t.Errorf("%s printed %q, want a match for %q", strings.Join(c.argv, " "), out, c.want)
			}
		}

		installPlugins(t, root, ds)

		if err := os.MkdirAll(filepath.Join(root, "manifests"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "manifests", "cluster.yaml"), []byte(clusterState), 0o644); err != nil {
			t.Fatal(err)
		}
		agent := []string{image.Entrypoint, "agent", "--once", "--health-addr", "", "--manifests", "/manifests", "--node-name", "node-a"}

		out, err := chrooted(t, root, append(agent, "--backend", "nftables")...)
		if err != nil {
			t.Fatalf("agent --backend nftables: %v\n%s", err, out)
		}
		rules := host(t, "nft", "list", "table", "inet", "netwarden")
		for _, want := range []string{"10.244.1.7", "10.244.2.9", "5432"} {
			if !strings.Contains(rules, want) {
				t.Errorf("table inet netwarden does not mention %s:\n%s", want, rules)
			}
		}

		// The iptables backend replaces the nftables one (the agent retires the other backend).
		out, err = chrooted(t, root, append(agent, "--backend", "iptables")...)
		if err != nil {
			t.Fatalf("agent --backend iptables: %v\n%s", err, out)
		}
		if ruleset := host(t, "nft", "list", "ruleset"); strings.Contains(ruleset, "table inet netwarden") {
			t.Errorf("table inet netwarden is still there after the iptables backend took over:\n%s", ruleset)
		}
		saved := host(t, "iptables-nft-save", "-t", "mangle")
		if !strings.Contains(saved, "-d 10.244.1.7/32 -g NETWARDEN-") {
			t.Errorf("iptables-nft-save shows no netwarden ingress rule for 10.244.1.7:\n%s", saved)
		}
		// The allowed peers and the port are ipset members (hash:ip and hash:ip,port).
		sets := host(t, "ipset", "list")
		for _, want := range []string{"10.244.2.9", "10.244.1.7,tcp:5432"} {
			if !strings.Contains(sets, want) {
				t.Errorf("no ipset holds %s:\n%s", want, sets)
			}
		}
	}, "nft", "iptables-nft-save", "ipset")
}

func daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "20-daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	return &ds
}

// installPlugins runs the DaemonSet's init container command, unchanged, in the image, with the
// node's CNI directory at the path the manifest mounts it, and wants every plugin of the image
// installed there, executable and identical.
func installPlugins(t *testing.T, root string, ds *appsv1.DaemonSet) {
	t.Helper()
	inits := ds.Spec.Template.Spec.InitContainers
	if len(inits) != 1 || len(inits[0].VolumeMounts) != 1 {
		t.Fatalf("want one init container with one volume mount, got %+v", inits)
	}
	hostDir := filepath.Join(root, inits[0].VolumeMounts[0].MountPath)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := chrooted(t, root, inits[0].Command...)
	if err != nil {
		t.Fatalf("init container %s: %v\n%s", inits[0].Name, err, out)
	}
	for _, name := range image.CNIPlugins {
		want, err := os.ReadFile(filepath.Join(root, image.CNIDir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(hostDir, name))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s not installed as in the image (%v)\n%s", name, err, out)
			continue
		}
		if fi, err := os.Stat(filepath.Join(hostDir, name)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s installed with mode %v (%v), want 0755", name, fi.Mode(), err)
		}
	}
}
