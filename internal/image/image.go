// Package image builds the netwarden container image, without a container engine: the static
// netwarden binaries and the netfilter userspace (nft, iptables, ipset, conntrack) taken from
// Debian packages with exactly the shared libraries they load. Equal inputs give an equal digest.
// It writes the image as an OCI layout and as docker-archive tarballs, or pushes it to a registry.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths inside the image that deploy/20-daemonset.yaml relies on.
const (
	Entrypoint = "/usr/local/bin/netwarden"
	CNIDir     = "/opt/netwarden/cni"
)

// CNIPlugins are the binaries the DaemonSet's init container copies to the node.
var CNIPlugins = []string{"netwarden-portmap", "netwarden-ipmasq", "netwarden-gate"}

// debianPackages are the roots of the Debian dependency closure. busybox-static gives the init
// container its /bin/sh, cp, chmod and mv, and a shell for debugging, in one static binary.
var debianPackages = []string{"nftables", "iptables", "ipset", "conntrack", "busybox-static", "netbase"}

// keep are the Debian files the image takes (with what they need); %s is the multiarch triplet.
var keep = []string{
	"/usr/sbin/nft",
	"/usr/sbin/xtables-nft-multi",
	"/usr/sbin/xtables-legacy-multi",
	// The names the agent runs: {ip,ip6}tables-{nft,legacy}{,-save,-restore}.
	"/usr/sbin/iptables-nft*",
	"/usr/sbin/ip6tables-nft*",
	"/usr/sbin/iptables-legacy*",
	"/usr/sbin/ip6tables-legacy*",
	// Match and target extensions, which iptables dlopens by path, so no DT_NEEDED names them.
	"/usr/lib/%s/xtables/libxt_*.so",
	"/usr/lib/%s/xtables/libipt_*.so",
	"/usr/lib/%s/xtables/libip6t_*.so",
	"/usr/sbin/ipset",
	"/usr/sbin/conntrack",
	"/bin/busybox",
	// Protocol and service names that iptables, ipset and conntrack look up through libc.
	"/etc/protocols",
	"/etc/services",
}

// links are symlinks the image adds: the default names that Debian's alternatives system would
// create at install time (nft variant, as on a fresh Debian), and busybox's applets.
var links = map[string]string{
	"/usr/sbin/iptables":          "iptables-nft",
	"/usr/sbin/iptables-save":     "iptables-nft-save",
	"/usr/sbin/iptables-restore":  "iptables-nft-restore",
	"/usr/sbin/ip6tables":         "ip6tables-nft",
	"/usr/sbin/ip6tables-save":    "ip6tables-nft-save",
	"/usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
}

var busyboxApplets = []string{"sh", "cp", "chmod", "mv", "rm", "ls", "cat", "basename", "mkdir", "ln"}

var triplets = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// Config says what to build.
type Config struct {
	Archs   []string // Debian architecture names, which are also GOARCH values: amd64, arm64
	Version string   // netwarden's version, linked into the binary and put in a label
	Source  string   // repository root, where the binaries are built
	// BinDir, when set, holds prebuilt static binaries in BinDir/<arch>/ instead.
	BinDir   string
	CacheDir string // Debian packages and apt state
	// Release, Mirror, SecurityMirror, Refresh: see Apt.
	Release, Mirror, SecurityMirror string
	Refresh                         bool
	Created                         time.Time // every timestamp in the image
	Log                             io.Writer
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

// Build returns the image for every architecture in c.Archs, in that order, and the index that
// holds them all.
func Build(ctx context.Context, c Config) (v1.ImageIndex, []v1.Image, error) {
	if len(c.Archs) == 0 {
		return nil, nil, fmt.Errorf("no architecture")
	}
	if c.Release == "" {
		c.Release = "bookworm"
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var imgs []v1.Image
	for _, arch := range c.Archs {
		img, err := buildArch(ctx, c, arch)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", arch, err)
		}
		imgs = append(imgs, img)
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: cf.Platform()}})
	}
	return idx, imgs, nil
}

// BuildBinaries builds netwarden and the CNI plugins for arch into dir: static (CGO_ENABLED=0),
// so they need nothing from the image's libc, and reproducible (-trimpath, no VCS stamp).
func BuildBinaries(ctx context.Context, source, arch, version, dir string) error {
	args := []string{"build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X github.com/netwarden/netwarden/internal/cli.Version=" + version,
		"-o", dir + "/", "./cmd/netwarden"}
	for _, p := range CNIPlugins {
		args = append(args, "./cmd/"+p)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = source
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func buildArch(ctx context.Context, c Config, arch string) (v1.Image, error) {
	triplet, ok := triplets[arch]
	if !ok {
		return nil, fmt.Errorf("unsupported architecture (want one of amd64, arm64)")
	}
	binDir := filepath.Join(c.BinDir, arch)
	if c.BinDir == "" {
		tmp, err := os.MkdirTemp("", "netwarden-image-bin-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		binDir = tmp
		c.logf("building the netwarden binaries for linux/%s", arch)
		if err := BuildBinaries(ctx, c.Source, arch, c.Version, binDir); err != nil {
			return nil, err
		}
	}
	apt := &Apt{Arch: arch, Dir: c.CacheDir, Release: c.Release, Mirror: c.Mirror, SecurityMirror: c.SecurityMirror, Refresh: c.Refresh, Log: c.Log}
	pkgs, err := apt.Fetch(ctx, debianPackages)
	if err != nil {
		return nil, err
	}
	dfs, err := indexPackages(pkgs)
	if err != nil {
		return nil, err
	}
	sel := newSelection(dfs, triplet)
	for _, pattern := range keep {
		if strings.Contains(pattern, "%s") {
			pattern = fmt.Sprintf(pattern, triplet)
		}
		if err := sel.addGlob(pattern); err != nil {
			return nil, err
		}
	}
	for _, pkg := range sel.packages() {
		if err := sel.add("/usr/share/doc/" + pkg + "/copyright"); err != nil {
			return nil, fmt.Errorf("copyright of %s: %w", pkg, err)
		}
	}
	// The copyright files can pull in other packages' files only through doc symlinks, which
	// are not ELF, so one more pass covers every contributing package.
	for _, pkg := range sel.packages() {
		if err := sel.add("/usr/share/doc/" + pkg + "/copyright"); err != nil {
			return nil, fmt.Errorf("copyright of %s: %w", pkg, err)
		}
	}

	base := map[string]entry{"/tmp": {dir: true, mode: 0o1777}, "/run": {dir: true, mode: 0o755}}
	for p, f := range sel.files {
		if f.link != "" {
			base[p] = entry{link: f.link}
		} else {
			base[p] = entry{src: f.src, mode: fileMode(f.exec)}
		}
	}
	extra := map[string]string{}
	for p, target := range links {
		extra[p] = target
	}
	for _, a := range busyboxApplets {
		extra["/bin/"+a] = "busybox"
	}
	for p, target := range extra {
		if _, dup := base[p]; dup {
			return nil, fmt.Errorf("%s: a package already ships it", p)
		}
		if !sel.exists(linkTarget(p, target)) {
			return nil, fmt.Errorf("%s -> %s: target not in the image", p, target)
		}
		base[p] = entry{link: target}
	}

	own := map[string]entry{}
	for _, name := range append([]string{"netwarden"}, CNIPlugins...) {
		src := filepath.Join(binDir, name)
		needed, interp, err := elfDeps(src)
		if err != nil {
			return nil, err
		}
		if interp != "" || len(needed) > 0 {
			return nil, fmt.Errorf("%s is dynamically linked (%s %v); build it with CGO_ENABLED=0", src, interp, needed)
		}
		dst := path.Join(CNIDir, name)
		if name == "netwarden" {
			dst = Entrypoint
		}
		own[dst] = entry{src: src, mode: 0o755}
	}

	var debs []string
	for _, p := range pkgs {
		if slicesContains(sel.packages(), p.Name) {
			debs = append(debs, p.Name+"="+p.Version)
		}
	}
	c.logf("%s: %d files from %d Debian packages: %s", arch, len(sel.files), len(debs), strings.Join(debs, " "))

	created := v1.Time{Time: c.Created.UTC()}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, l := range []struct {
		files map[string]entry
		by    string
	}{
		{base, "netfilter userspace from Debian " + c.Release + ": " + strings.Join(debs, " ")},
		{own, "netwarden " + c.Version},
	} {
		layer, err := tarLayer(l.files, c.Created)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: l.by, Comment: "netwarden-image"}})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = arch, "linux", created
	if arch == "arm64" {
		cf.Variant = "v8"
	}
	cf.Config.Entrypoint = []string{Entrypoint}
	cf.Config.Cmd = []string{"agent"}
	cf.Config.User = "0"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "netwarden",
		"org.opencontainers.image.version":  c.Version,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.source":   "https://github.com/netwarden/netwarden",
	}
	return mutate.ConfigFile(img, cf)
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func fileMode(exec bool) int64 {
	if exec {
		return 0o755
	}
	return 0o644
}

// entry is one tar entry: a directory, a symlink, or a regular file read from src.
type entry struct {
	dir  bool
	link string
	src  string
	mode int64
}

// tarLayer writes files, and every parent directory, as one layer. Reproducible: entries are
// sorted, every timestamp is created, owners are root and modes are fixed, whatever the host's
// umask, file times and owners were.
func tarLayer(files map[string]entry, created time.Time) (v1.Layer, error) {
	all := map[string]entry{}
	for p, e := range files {
		all[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if parent, ok := files[d]; ok && !parent.dir {
				return nil, fmt.Errorf("%s is a file or symlink, and the parent of %s", d, p)
			}
			if _, ok := all[d]; !ok {
				all[d] = entry{dir: true, mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(all))
	for p := range all {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		e := all[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: created.UTC(), Mode: e.mode}
		var data []byte
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			var err error
			if data, err = os.ReadFile(e.src); err != nil {
				return nil, err
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}
