package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/seccomp"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/image"
	"github.com/cellbox/cellbox/server"
)

func init() {
	register(command{
		name:  "image",
		usage: "build base|python|node [--images DIR] [--backend docker|local|both] [--force] [--oci FILE] | agent --oci FILE [--binary PATH] | seccomp | ls [--images DIR]  box images (shared by every data dir: $" + server.ImagesEnv + ", else DATA/images of the default data dir)",
		run:   runImage,
	})
}

func runImage(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("want a subcommand: build NAME or ls")
	}
	fs := flag.NewFlagSet("image "+args[0], flag.ContinueOnError)
	images := fs.String("images", server.DefaultImagesDir(), "images directory, shared by every data dir (env "+server.ImagesEnv+")")
	switch args[0] {
	case "build":
		backendFlag := fs.String("backend", "both", "where the image is used: docker (rootfs + docker import), local (rootfs only), both")
		force := fs.Bool("force", false, "rebuild the rootfs and re-import it even if they exist")
		quiet := fs.Bool("q", false, "do not show debootstrap's output")
		oci := fs.String("oci", "", "also write the image as an OCI archive to `FILE` (for ctr images import on a Kubernetes node, or skopeo copy oci-archive:FILE docker://REF to a registry)")
		name, rest := "", args[1:]
		if len(rest) > 0 && rest[0] != "" && rest[0][0] != '-' {
			name, rest = rest[0], rest[1:]
		}
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if name == "" && fs.NArg() == 1 {
			name = fs.Arg(0)
		} else if fs.NArg() > 0 || name == "" {
			return fmt.Errorf("want exactly one image name (%v)", image.Names())
		}
		if *backendFlag != "docker" && *backendFlag != "local" && *backendFlag != "both" {
			return fmt.Errorf("--backend %q: want docker, local or both", *backendFlag)
		}
		if *oci != "" {
			// Said before a build of minutes, not after.
			if fi, err := os.Stat(filepath.Dir(*oci)); err != nil || !fi.IsDir() {
				return fmt.Errorf("--oci %s: its directory %s does not exist; make it, or name a file in an existing directory", *oci, filepath.Dir(*oci))
			}
		}
		var out io.Writer = os.Stderr
		if *quiet {
			out = nil
		}
		if err := imageBuild(ctx, *images, name, *backendFlag, *force, out); err != nil {
			return err
		}
		if *oci == "" {
			return nil
		}
		return imageOCI(ctx, *images, name, *oci)
	case "agent":
		oci := fs.String("oci", "", "write the agent image as an OCI archive to `FILE` (required)")
		binary := fs.String("binary", "", "the static cellbox binary to pack (default: this one)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *oci == "" || fs.NArg() > 0 {
			return errors.New("want --oci FILE (and nothing else but --binary)")
		}
		return imageAgentOCI(ctx, *binary, *oci)
	case "seccomp":
		// cellbox's seccomp filter as a Docker/containerd seccomp profile:
		// what a Kubernetes node needs as a Localhost profile
		// (CELLBOX_KUBE_SECCOMP) for boxes to refuse what they refuse
		// on the other backends.
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		fmt.Println(seccomp.DockerProfile())
		return nil
	case "ls":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return imageList(ctx, *images)
	default:
		return fmt.Errorf("unknown subcommand %q: want build, agent, seccomp or ls", args[0])
	}
}

func imageBuild(ctx context.Context, imagesDir, name, where string, force bool, out io.Writer) error {
	start := time.Now()
	in, built, err := image.Build(ctx, image.BuildOptions{ImagesDir: imagesDir, Name: name, Force: force, Output: out})
	if err != nil {
		return err
	}
	if built {
		fmt.Printf("built %s: %s (%s) in %s\n", name, in.Rootfs, humanBytes(in.Size), time.Since(start).Round(time.Second))
	} else {
		fmt.Printf("%s: rootfs exists at %s (--force rebuilds)\n", name, in.Rootfs)
	}
	if where == "local" {
		return nil
	}
	err = imageImport(ctx, in, name, where, built, force)
	if err != nil && ctx.Err() != nil {
		// The rootfs is complete (Build installs only a finished one);
		// Docker tags an import only once it is whole.
		return fmt.Errorf("interrupted (%v) while importing into Docker: %s is as it was; the rootfs at %s is built, `cellbox image build %s` imports it", context.Cause(ctx), image.Ref(name), in.Rootfs, name)
	}
	return err
}

// imageImport imports a built rootfs into Docker as cellbox/NAME.
func imageImport(ctx context.Context, in image.Info, name, where string, built, force bool) error {
	d, err := docker.New(ctx, docker.Options{})
	if err != nil {
		if where == "both" && ctx.Err() == nil {
			fmt.Printf("%s: not imported into Docker: %v\n", name, err)
			return nil
		}
		return err
	}
	defer d.Close()
	ref := image.Ref(name)
	if id, err := d.ImageID(ctx, ref); err != nil {
		return err
	} else if id != "" && !built && !force {
		fmt.Printf("%s: docker image %s exists (%s)\n", name, ref, id)
		return nil
	}
	pr, pw := io.Pipe()
	tarDone := make(chan struct{})
	go func() {
		defer close(tarDone)
		pw.CloseWithError(image.Tar(ctx, in.Rootfs, pw))
	}()
	id, err := d.ImportImage(ctx, ref, pr)
	pr.CloseWithError(err)
	<-tarDone // no tar outlives the command
	if err != nil {
		return err
	}
	fmt.Printf("%s: imported into Docker as %s (%s)\n", name, ref, id)
	return nil
}

// imageOCI writes the built rootfs of image name as an OCI archive to
// file, in place: a partial archive is removed.
func imageOCI(ctx context.Context, imagesDir, name, file string) error {
	in, err := image.Read(image.RootfsDir(imagesDir, name))
	if err != nil {
		return err
	}
	start := time.Now()
	if err := writeOCIFile(file, func(w io.Writer) error {
		_, err := image.WriteOCI(ctx, in.Rootfs, name, w, image.OCIOptions{TempDir: filepath.Dir(file)})
		return err
	}); err != nil {
		return err
	}
	fi, _ := os.Stat(file)
	fmt.Printf("%s: OCI archive %s (%s, %s) in %s; load it with: ctr -n k8s.io images import %s\n", name, file, image.OCIName(name), humanBytes(fi.Size()), time.Since(start).Round(time.Second), file)
	return nil
}

// writeOCIFile writes rootfs as an OCI archive to file, in place: a
// partial archive is removed.
func writeOCIFile(file string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return fmt.Errorf("--oci: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = write(tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		return fmt.Errorf("--oci %s: %w", file, err)
	}
	return nil
}

// imageAgentOCI writes the agent image of a Kubernetes box (the static
// cellbox binary alone, at /cellbox, named kube.AgentImage of it) as an
// OCI archive to file.
func imageAgentOCI(ctx context.Context, binary, file string) error {
	if binary == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		binary = self
	}
	ref, err := backend.AgentImage(binary)
	if err != nil {
		return err
	}
	if err := writeOCIFile(file, func(w io.Writer) error {
		return image.WriteAgentOCI(ctx, binary, ref, filepath.Dir(file), w)
	}); err != nil {
		return err
	}
	fmt.Printf("agent image %s: OCI archive %s; load it on every node with: ctr -n k8s.io images import %s\n", ref, file, file)
	return nil
}

func imageList(ctx context.Context, imagesDir string) error {
	imgs, err := image.List(imagesDir)
	if err != nil {
		return err
	}
	if len(imgs) == 0 {
		fmt.Fprintf(os.Stderr, "no images built in %s (build one: cellbox image build NAME --images %s; boxes of the default image need none)\n", imagesDir, imagesDir)
		return nil
	}
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	d, _ := docker.New(c, docker.Options{})
	cancel()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROOTFS\tSIZE\tBUILT\tDOCKER IMAGE")
	for _, in := range imgs {
		id := "-"
		if d != nil {
			if s, err := d.ImageID(ctx, image.Ref(in.Name)); err == nil && s != "" {
				id = image.Ref(in.Name) + " " + s
			}
		} else {
			id = "(no Docker Engine)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", in.Name, in.Rootfs, humanBytes(in.Size), in.Built.Local().Format(time.DateTime), id)
	}
	if d != nil {
		d.Close()
	}
	return tw.Flush()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}
