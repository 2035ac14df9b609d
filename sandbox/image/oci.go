package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// An OCI archive is an image without Docker: the OCI image layout
// (oci-layout, index.json, blobs/sha256/...) in one tar file, which
// `ctr images import` loads into a containerd (a Kubernetes node's, under
// the k8s.io namespace) and `skopeo copy oci-archive:FILE docker://REF`
// pushes to a registry. The image is the rootfs as one gzipped layer, with
// the settings `docker import` gives the Docker image (working directory
// the workspace, the box user).
//
// Written by hand rather than with a library (go-containerregistry, the
// containers/image stack): the format is three JSON documents and a
// layer, the types are the spec's own (image-spec), and either library
// would add tens of packages to the binary every box mounts.

// OCIName is the name an OCI archive of image name gives the image
// (annotation io.containerd.image.name): docker.io/cellbox/NAME:latest,
// the name Kubernetes resolves the image cellbox/NAME to.
func OCIName(name string) string { return "docker.io/" + Ref(name) + ":latest" }

// OCIOptions configure WriteOCI.
type OCIOptions struct {
	// TempDir holds the compressed layer while it is written (its size
	// goes in the archive before it): a directory with room for it. ""
	// is os.TempDir().
	TempDir string
	// Created is the image's creation time; zero is now.
	Created time.Time
	// Ref names the image (repository:tag, e.g. cellbox/agent:0123abcd);
	// "" is Ref(name):latest.
	Ref string
}

// WriteOCI writes the root filesystem rootfs as an OCI archive of image
// name to w and returns the manifest's descriptor.
func WriteOCI(ctx context.Context, rootfs, name string, w io.Writer, o OCIOptions) (ocispec.Descriptor, error) {
	layer, err := os.CreateTemp(o.TempDir, ".cellbox-oci-layer-*")
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("oci archive: %w", err)
	}
	defer os.Remove(layer.Name())
	defer layer.Close()

	// One pass: tar -> (diff id) -> gzip -> (digest) -> the file.
	blobHash, diffHash := sha256.New(), sha256.New()
	zw, _ := gzip.NewWriterLevel(io.MultiWriter(layer, blobHash), gzip.BestSpeed)
	if err := Tar(ctx, rootfs, io.MultiWriter(zw, diffHash)); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := zw.Close(); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("oci archive: compress the layer: %w", err)
	}
	size, err := layer.Seek(0, io.SeekCurrent)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("oci archive: %w", err)
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("oci archive: %w", err)
	}
	layerDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: sum(blobHash), Size: size}

	platform := ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"}
	created := o.Created
	if created.IsZero() {
		created = time.Now().UTC()
	}
	config, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: platform,
		Config: ocispec.ImageConfig{
			User:       strconv.Itoa(backend.BoxUID) + ":" + strconv.Itoa(backend.BoxGID),
			WorkingDir: backend.Workspace,
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		},
		RootFS:  ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{sum(diffHash)}},
		History: []ocispec.History{{Created: &created, CreatedBy: "cellbox image build " + name}},
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	configDesc := describe(ocispec.MediaTypeImageConfig, config)
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    []ocispec.Descriptor{layerDesc},
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	manifestDesc := describe(ocispec.MediaTypeImageManifest, manifest)
	full, repo, tag := OCIName(name), Ref(name), "latest"
	if o.Ref != "" {
		repo, tag, _ = strings.Cut(o.Ref, ":")
		full = "docker.io/" + o.Ref
	}
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":    full,
		ocispec.AnnotationRefName:     tag,
		ocispec.AnnotationTitle:       repo,
		ocispec.AnnotationCreated:     created.Format(time.RFC3339),
		ocispec.AnnotationDescription: "cellbox box image " + name + " (cellbox image build)",
	}
	manifestDesc.Platform = &platform
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifestDesc},
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}

	tw := tar.NewWriter(w)
	put := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: created, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("%s: %d bytes written, %d expected", name, n, size)
		}
		return err
	}
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	for _, f := range []struct {
		name string
		size int64
		r    io.Reader
	}{
		{ocispec.ImageLayoutFile, int64(len(layout)), bytes.NewReader(layout)},
		{blobPath(layerDesc.Digest), size, layer},
		{blobPath(configDesc.Digest), configDesc.Size, bytes.NewReader(config)},
		{blobPath(manifestDesc.Digest), manifestDesc.Size, bytes.NewReader(manifest)},
		{ocispec.ImageIndexFile, int64(len(index)), bytes.NewReader(index)},
	} {
		if err := ctx.Err(); err != nil {
			return ocispec.Descriptor{}, err
		}
		if err := put(f.name, f.size, f.r); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("oci archive: write %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("oci archive: %w", err)
	}
	return manifestDesc, nil
}

func sum(h hash.Hash) digest.Digest { return digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)) }

func describe(mediaType string, b []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
}

func blobPath(d digest.Digest) string { return "blobs/" + d.Algorithm().String() + "/" + d.Encoded() }

// WriteAgentOCI writes the agent image of a Kubernetes box as an OCI
// archive to w: the static cellbox binary alone, at /cellbox, named ref
// (kube.AgentImage of the binary). tmp holds its one-file root while it
// is written.
func WriteAgentOCI(ctx context.Context, binary, ref, tmp string, w io.Writer) error {
	root, err := os.MkdirTemp(tmp, ".cellbox-agent-root-*")
	if err != nil {
		return fmt.Errorf("agent image: %w", err)
	}
	defer os.RemoveAll(root)
	in, err := os.Open(binary)
	if err != nil {
		return fmt.Errorf("agent image: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(filepath.Join(root, "cellbox"), os.O_CREATE|os.O_WRONLY, 0o555)
	if err != nil {
		return fmt.Errorf("agent image: %w", err)
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("agent image: %w", err)
	}
	_, err = WriteOCI(ctx, root, "agent", w, OCIOptions{TempDir: tmp, Ref: ref})
	return err
}
