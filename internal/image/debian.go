package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Apt fetches Debian packages for one architecture. It keeps its own apt state (sources, lists,
// cache) under Dir, so a foreign architecture needs no `dpkg --add-architecture` on the host, the
// host's apt state is never touched, and the host's extra repositories cannot leak into the image.
type Apt struct {
	Arch    string // Debian architecture: amd64, arm64
	Dir     string // cache root; one subdirectory per architecture
	Release string // Debian release, such as bookworm
	// Mirror and SecurityMirror default to deb.debian.org; a snapshot.debian.org URL pins every
	// package version, which is what makes an image rebuildable bit for bit later.
	Mirror, SecurityMirror string
	Keyring                string // default /usr/share/keyrings/debian-archive-keyring.gpg
	Refresh                bool   // run apt-get update even when package lists are present
	Log                    io.Writer
}

// Package is one downloaded and unpacked Debian package.
type Package struct {
	Name, Version, Arch string
	Deb                 string // the .deb file
	Root                string // where dpkg-deb -x unpacked it
}

func (a *Apt) root() string { return filepath.Join(a.Dir, a.Arch) }

func (a *Apt) logf(format string, args ...any) {
	if a.Log != nil {
		fmt.Fprintf(a.Log, format+"\n", args...)
	}
}

func (a *Apt) options() []string {
	r := a.root()
	return []string{
		"-o", "Dir::Etc::SourceList=" + filepath.Join(r, "debian.sources"),
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(r, "empty"),
		"-o", "Dir::Etc::PreferencesParts=" + filepath.Join(r, "empty"),
		"-o", "Dir::Etc::Preferences=" + filepath.Join(r, "empty", "preferences"),
		"-o", "Dir::State=" + filepath.Join(r, "state"),
		"-o", "Dir::State::status=" + filepath.Join(r, "state", "status"),
		"-o", "Dir::Cache=" + filepath.Join(r, "cache"),
		"-o", "APT::Architecture=" + a.Arch,
		"-o", "APT::Architectures=" + a.Arch,
		// Downloads land in a directory of ours that the _apt user may not be able to write.
		"-o", "APT::Sandbox::User=root",
	}
}

func (a *Apt) run(ctx context.Context, dir, tool string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, tool, append(a.options(), args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w\n%s", tool, strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

func (a *Apt) setup(ctx context.Context) error {
	r := a.root()
	for _, d := range []string{"empty", "state/lists/partial", "cache/archives/partial", "debs", "unpacked"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			return err
		}
	}
	mirror, security, keyring := a.Mirror, a.SecurityMirror, a.Keyring
	if mirror == "" {
		mirror = "http://deb.debian.org/debian"
	}
	if security == "" {
		security = "http://deb.debian.org/debian-security"
	}
	if keyring == "" {
		keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	}
	sources := fmt.Sprintf("Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n\n"+
		"Types: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n",
		mirror, a.Release, a.Release, keyring, security, a.Release, keyring)
	srcFile := filepath.Join(r, "debian.sources")
	old, _ := os.ReadFile(srcFile)
	changed := string(old) != sources
	if changed {
		if err := os.WriteFile(srcFile, []byte(sources), 0o644); err != nil {
			return err
		}
	}
	if err := touch(filepath.Join(r, "state", "status")); err != nil {
		return err
	}
	lists, _ := filepath.Glob(filepath.Join(r, "state", "lists", "*_Packages*"))
	if len(lists) > 0 && !changed && !a.Refresh {
		return nil
	}
	a.logf("apt-get update (%s, %s)", a.Release, a.Arch)
	_, err := a.run(ctx, r, "apt-get", "-q", "update")
	return err
}

func touch(p string) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// Fetch downloads and unpacks names and everything they depend on (Depends and Pre-Depends,
// recursively; not Recommends). Debian derives a library package's Depends from the DT_NEEDED
// entries of its binaries, so the closure holds every shared library the binaries load; the image
// then takes from it only the files it needs. Downloads and unpacked trees are cached by file name
// (package, version, architecture) and checked against the archive's SHA256.
func (a *Apt) Fetch(ctx context.Context, names []string) ([]Package, error) {
	if err := a.setup(ctx); err != nil {
		return nil, err
	}
	out, err := a.run(ctx, a.root(), "apt-cache", append([]string{"depends", "--recurse", "--no-recommends",
		"--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, names...)...)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		// Unindented lines are packages; "<name>" is a virtual package, provided by a real one
		// that is listed too.
		if line == "" || line[0] == ' ' || line[0] == '<' {
			continue
		}
		set[strings.TrimSuffix(line, ":"+a.Arch)] = true
	}
	closure := make([]string, 0, len(set))
	for n := range set {
		closure = append(closure, n)
	}
	sort.Strings(closure)
	out, err = a.run(ctx, a.root(), "apt-cache", append([]string{"show", "--no-all-versions"}, closure...)...)
	if err != nil {
		return nil, err
	}
	stanzas := parseStanzas(out)
	if len(stanzas) != len(closure) {
		return nil, fmt.Errorf("apt-cache show returned %d packages for %d names", len(stanzas), len(closure))
	}
	var pkgs []Package
	for _, s := range stanzas {
		p, err := a.fetchOne(ctx, s)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func (a *Apt) fetchOne(ctx context.Context, s map[string]string) (Package, error) {
	p := Package{Name: s["Package"], Version: s["Version"], Arch: s["Architecture"]}
	if p.Name == "" || p.Version == "" || s["Filename"] == "" || s["SHA256"] == "" {
		return p, fmt.Errorf("incomplete package record: %v", s)
	}
	base := path.Base(s["Filename"])
	p.Deb = filepath.Join(a.root(), "debs", base)
	if sum, err := fileSHA256(p.Deb); err != nil || sum != s["SHA256"] {
		a.logf("downloading %s", base)
		// apt-get download names the file after the version with its epoch escaped ("1%3a"),
		// so it downloads alone into a directory of its own and the file is renamed.
		tmp, err := os.MkdirTemp(filepath.Join(a.root(), "debs"), ".download-")
		if err != nil {
			return p, err
		}
		defer os.RemoveAll(tmp)
		if _, err := a.run(ctx, tmp, "apt-get", "-q", "download", p.Name+":"+a.Arch+"="+p.Version); err != nil {
			return p, err
		}
		got, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
		if len(got) != 1 {
			return p, fmt.Errorf("apt-get download %s left %v", p.Name, got)
		}
		if err := os.Rename(got[0], p.Deb); err != nil {
			return p, err
		}
		if sum, err := fileSHA256(p.Deb); err != nil || sum != s["SHA256"] {
			return p, fmt.Errorf("%s: SHA256 %s, want %s (%v)", p.Deb, sum, s["SHA256"], err)
		}
	}
	p.Root = filepath.Join(a.root(), "unpacked", strings.TrimSuffix(base, ".deb"))
	if _, err := os.Stat(p.Root); err == nil {
		return p, nil
	}
	tmp := p.Root + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return p, err
	}
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", p.Deb, tmp).CombinedOutput(); err != nil {
		return p, fmt.Errorf("dpkg-deb -x %s: %w\n%s", p.Deb, err, out)
	}
	// Renamed into place only once complete, so an interrupted run never leaves a partial tree
	// that a later run would take as unpacked.
	return p, os.Rename(tmp, p.Root)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// parseStanzas reads deb822 paragraphs, keeping single-line fields (continuation lines belong to
// fields such as Description that are not needed).
func parseStanzas(b []byte) []map[string]string {
	var out []map[string]string
	cur := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = map[string]string{}
			}
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			cur[k] = strings.TrimSpace(v)
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
