package image

import (
	"context"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteLayout replaces dir with an OCI image layout whose index.json names idx as ref (the
// annotation `skopeo copy oci:DIR:REF` and `ctr images import` read).
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
}

// WriteTarball writes img as a docker-archive tarball tagged ref, which `docker load`,
// `podman load`, `ctr images import` and `kind load image-archive` accept. It holds one
// platform: docker load cannot take several images under one tag.
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// Push uploads the image to ref with the credentials of the default keychain (docker and
// podman config files, credential helpers): the index when there are several platforms, the
// image itself when there is one, so a single-platform push looks as a docker push would.
func Push(ctx context.Context, ref string, idx v1.ImageIndex, imgs []v1.Image) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	switch len(imgs) {
	case 0:
		return fmt.Errorf("no image to push")
	case 1:
		return remote.Write(r, imgs[0], opts...)
	default:
		return remote.WriteIndex(r, idx, opts...)
	}
}

// CompressedSize is what a registry stores and a node pulls for img: its gzip layers, config and
// manifest.
func CompressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	n := m.Config.Size + int64(len(raw))
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}
