// Command netwarden-image builds the netwarden container image without a container engine
// (`make image`) and pushes it (`make push`). The work is in internal/image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/netwarden/netwarden/internal/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "netwarden-image:", err)
		os.Exit(1)
	}
}

func run() error {
	var c image.Config
	var archs, out, ref, push string
	flag.StringVar(&archs, "arch", "amd64", "comma-separated architectures: amd64, arm64")
	flag.StringVar(&c.Version, "version", "dev", "netwarden version, linked into the binary and labelled")
	flag.StringVar(&c.Source, "source", ".", "repository root to build the binaries from")
	flag.StringVar(&c.BinDir, "bin-dir", "", "use prebuilt static binaries from DIR/<arch>/ instead of building them")
	flag.StringVar(&c.CacheDir, "cache", filepath.Join(os.TempDir(), "netwarden-image-cache"), "Debian packages and apt state")
	flag.StringVar(&c.Release, "debian-release", "bookworm", "Debian release the userspace tools come from")
	flag.StringVar(&c.Mirror, "debian-mirror", "", "Debian mirror (default http://deb.debian.org/debian; a snapshot.debian.org URL pins versions)")
	flag.StringVar(&c.SecurityMirror, "debian-security-mirror", "", "Debian security mirror (default http://deb.debian.org/debian-security)")
	flag.BoolVar(&c.Refresh, "refresh", false, "apt-get update even when package lists are cached")
	flag.StringVar(&out, "out", "bin/image", "output directory: oci/ (OCI layout) and netwarden-<arch>.tar (docker-archive)")
	flag.StringVar(&ref, "tag", "ghcr.io/netwarden/netwarden:dev", "image name and tag recorded in the outputs")
	flag.StringVar(&push, "push", "", "push to this reference (REGISTRY/netwarden:TAG) instead of writing files")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", flag.Args())
	}
	c.Archs = strings.Split(archs, ",")
	// SOURCE_DATE_EPOCH is the reproducible-builds convention for "the time of the inputs";
	// without it, every timestamp is the Unix epoch, which is just as reproducible.
	c.Created = time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		c.Created = time.Unix(sec, 0)
	}
	c.Log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	idx, imgs, err := image.Build(ctx, c)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if push != "" {
		if err := image.Push(ctx, push, idx, imgs); err != nil {
			return err
		}
		fmt.Printf("pushed %s (index %s)\n", push, digest)
		return nil
	}
	if err := image.WriteLayout(filepath.Join(out, "oci"), ref, idx); err != nil {
		return err
	}
	fmt.Printf("%s: index %s\n", filepath.Join(out, "oci"), digest)
	for i, img := range imgs {
		file := filepath.Join(out, "netwarden-"+c.Archs[i]+".tar")
		if err := image.WriteTarball(file, ref, img); err != nil {
			return err
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		size, err := image.CompressedSize(img)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s %s, %.1f MiB compressed\n", file, c.Archs[i], d, float64(size)/(1<<20))
	}
	return nil
}
