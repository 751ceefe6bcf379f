package image

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// file is one entry of the image's file system: a regular file copied from src, or a symlink.
type file struct {
	src  string // host path of a regular file
	link string // symlink target
	exec bool   // regular file with an executable bit
	pkg  string // Debian package it comes from; "" for netwarden's own files
}

// debianFS indexes the files of unpacked packages by their path in the image.
type debianFS struct {
	files    map[string]file
	conflict map[string]bool // paths that more than one package ships
}

func indexPackages(pkgs []Package) (*debianFS, error) {
	d := &debianFS{files: map[string]file{}, conflict: map[string]bool{}}
	for _, p := range pkgs {
		err := filepath.WalkDir(p.Root, func(hostPath string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			rel, err := filepath.Rel(p.Root, hostPath)
			if err != nil {
				return err
			}
			f := file{pkg: p.Name}
			switch {
			case e.Type()&fs.ModeSymlink != 0:
				if f.link, err = os.Readlink(hostPath); err != nil {
					return err
				}
			case e.Type().IsRegular():
				fi, err := e.Info()
				if err != nil {
					return err
				}
				f.src, f.exec = hostPath, fi.Mode()&0o111 != 0
			default:
				return nil
			}
			p := "/" + filepath.ToSlash(rel)
			if _, dup := d.files[p]; dup {
				d.conflict[p] = true
			}
			d.files[p] = f
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return d, nil
}

// selection is the set of Debian files the image takes: the wanted ones and, transitively,
// symlink targets, ELF interpreters and DT_NEEDED libraries.
type selection struct {
	fs        *debianFS
	libDirs   []string // the dynamic loader's default search path, in its order
	files     map[string]file
	elfChecks map[string]bool
}

func newSelection(d *debianFS, triplet string) *selection {
	return &selection{
		fs: d,
		// Without /etc/ld.so.cache (ldconfig never runs in the image) glibc's loader falls back
		// to these directories.
		libDirs:   []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib", "/usr/lib"},
		files:     map[string]file{},
		elfChecks: map[string]bool{},
	}
}

// splitSymlink finds the first proper prefix of p that is a symlink in the packages, so paths
// through directory symlinks (such as /usr/share/doc/libgcc-s1 -> gcc-12-base) resolve.
func (s *selection) splitSymlink(p string) (link, rest string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i := 1; i < len(parts); i++ {
		prefix := "/" + strings.Join(parts[:i], "/")
		if f, found := s.fs.files[prefix]; found && f.link != "" {
			return prefix, strings.Join(parts[i:], "/"), true
		}
	}
	return "", "", false
}

func linkTarget(linkPath, target string) string {
	if path.IsAbs(target) {
		return path.Clean(target)
	}
	return path.Join(path.Dir(linkPath), target)
}

// exists reports whether p resolves to a regular file in the packages.
func (s *selection) exists(p string) bool {
	for range 40 {
		if link, rest, ok := s.splitSymlink(p); ok {
			p = path.Join(linkTarget(link, s.fs.files[link].link), rest)
			continue
		}
		f, ok := s.fs.files[p]
		if !ok {
			return false
		}
		if f.link == "" {
			return true
		}
		p = linkTarget(p, f.link)
	}
	return false
}

// add takes p into the image with everything it needs to work.
func (s *selection) add(p string) error {
	return s.addDepth(path.Clean(p), 0)
}

func (s *selection) addDepth(p string, depth int) error {
	if depth > 40 {
		return fmt.Errorf("%s: too many levels of symlinks or dependencies", p)
	}
	if _, done := s.files[p]; done {
		return nil
	}
	if link, rest, ok := s.splitSymlink(p); ok {
		if err := s.addDepth(link, depth+1); err != nil {
			return err
		}
		return s.addDepth(path.Join(linkTarget(link, s.fs.files[link].link), rest), depth+1)
	}
	f, ok := s.fs.files[p]
	if !ok {
		return fmt.Errorf("%s: no package ships it", p)
	}
	if s.fs.conflict[p] {
		return fmt.Errorf("%s: shipped by more than one package", p)
	}
	s.files[p] = f
	if f.link != "" {
		return s.addDepth(linkTarget(p, f.link), depth+1)
	}
	needed, interp, err := elfDeps(f.src)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if interp != "" {
		if err := s.addDepth(interp, depth+1); err != nil {
			return fmt.Errorf("%s: interpreter: %w", p, err)
		}
	}
	for _, soname := range needed {
		found := false
		for _, dir := range s.libDirs {
			if cand := path.Join(dir, soname); s.exists(cand) {
				if err := s.addDepth(cand, depth+1); err != nil {
					return err
				}
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("%s needs %s, which no package in the dependency closure ships in %v", p, soname, s.libDirs)
		}
	}
	return nil
}

// addGlob takes every file matching pattern; a pattern that matches nothing is an error, so a
// package that moves a binary breaks the build instead of the image.
func (s *selection) addGlob(pattern string) error {
	var matches []string
	for p := range s.fs.files {
		if ok, err := path.Match(pattern, p); err != nil {
			return err
		} else if ok {
			matches = append(matches, p)
		}
	}
	if len(matches) == 0 {
		return fmt.Errorf("%s matches no file in the packages", pattern)
	}
	sort.Strings(matches)
	for _, p := range matches {
		if err := s.add(p); err != nil {
			return err
		}
	}
	return nil
}

// packages are the packages that contributed at least one file.
func (s *selection) packages() []string {
	set := map[string]bool{}
	for _, f := range s.files {
		set[f.pkg] = true
	}
	var out []string
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// elfDeps returns an ELF file's DT_NEEDED entries and its PT_INTERP; a file that is not ELF has
// neither.
func elfDeps(p string) (needed []string, interp string, err error) {
	magic := make([]byte, 4)
	if r, err := os.Open(p); err != nil {
		return nil, "", err
	} else {
		n, _ := r.Read(magic)
		r.Close()
		if n < 4 || string(magic) != elf.ELFMAG {
			return nil, "", nil
		}
	}
	f, err := elf.Open(p)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return nil, "", err
			}
			interp = string(bytes.TrimRight(b, "\x00"))
		}
	}
	needed, err = f.ImportedLibraries()
	return needed, interp, err
}
