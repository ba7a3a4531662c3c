package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/ociimage/debianpy"
)

// target is one image: a Go main package or a Python program, and the ref
// its image gets.
type target struct {
	name string // image and binary name
	pkg  string // Go main package, relative to the module root
	// script is a Python program, relative to the module root, run by
	// Debian's python3 with pythonPackages from the host; set instead of pkg.
	script         string
	pythonPackages []string
	ref            func(tag string) string
}

// source is the target's package directory or script.
func (t target) source() string {
	if t.script != "" {
		return t.script
	}
	return t.pkg
}

func ms2mRef(name string) func(string) string {
	return func(tag string) string { return "ms2m/" + name + ":" + tag }
}

// targets are every image the project ships. A main package or script that
// does not exist (yet) is skipped with a note, and so is a Python image
// when the host lacks Debian's python3 or one of its packages.
var targets = []target{
	{name: "sidecar", pkg: "./cmd/sidecar", ref: ms2mRef("sidecar")},
	{name: "webhook", pkg: "./cmd/webhook", ref: ms2mRef("webhook")},
	{name: "migrator", pkg: "./cmd/migrator", ref: ms2mRef("migrator")},
	{name: "consumer", pkg: "./examples/consumer", ref: ms2mRef("consumer")},
	{name: "producer", pkg: "./examples/producer", ref: ms2mRef("producer")},
	// The unmodified Python consumer, on the host's own Debian python3.
	{name: "consumer-python", script: "examples/consumer-python/consumer.py", pythonPackages: []string{"pika"}, ref: ms2mRef("consumer-python")},
	// The sandbox image containerd pins; the tag is the image's, not ours.
	{name: "pause", pkg: "./hack/pause", ref: func(string) string { return "registry.k8s.io/pause:3.10" }},
}

// indexFile lists what build wrote; push reads it.
const indexFile = "images.json"

type buildIndex struct {
	Tag    string       `json:"tag"`
	Images []builtImage `json:"images"`
}

type builtImage struct {
	Name    string `json:"name"`
	Ref     string `json:"ref"`
	Digest  string `json:"digest"`
	Size    int64  `json:"size"`    // manifest, config and layers: what a pull moves
	Tarball string `json:"tarball"` // docker-archive, relative to the output directory
}

// selectTargets returns the targets named in only (comma separated), or all.
func selectTargets(only string) ([]target, error) {
	if only == "" {
		return targets, nil
	}
	var out []target
	for _, n := range strings.Split(only, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(targets, func(t target) bool { return t.name == n })
		if i < 0 {
			return nil, usagef("-only: unknown image %q; known: %s", n, strings.Join(targetNames(), ", "))
		}
		out = append(out, targets[i])
	}
	return out, nil
}

func targetNames() []string {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.name
	}
	return names
}

func cmdBuild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	out := fs.String("o", "", "directory to write the image tarballs, OCI layout and "+indexFile+" to (required)")
	tag := fs.String("tag", "dev", "tag of the ms2m/* images")
	only := fs.String("only", "", "comma-separated images to build (default all: "+strings.Join(targetNames(), ",")+")")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *out == "" {
		return usagef("-o is required: the directory to write images to")
	}
	if _, err := name.NewTag("ms2m/x:" + *tag); err != nil {
		return usagef("-tag %q is not a valid image tag", *tag)
	}
	sel, err := selectTargets(*only)
	if err != nil {
		return err
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	var present, goTargets []target
	pyOpts := map[string]ociimage.FilesOptions{}
	for _, t := range sel {
		st, err := os.Stat(filepath.Join(root, t.source()))
		if err != nil || st.IsDir() != (t.script == "") {
			fmt.Fprintf(stderr, "skip %s: %s does not exist\n", t.name, t.source())
			continue
		}
		if t.script != "" {
			opts, err := debianpy.Options(t.pythonPackages...)
			if err != nil {
				fmt.Fprintf(stderr, "skip %s: %v\n", t.name, err)
				continue
			}
			pyOpts[t.name] = opts
		} else {
			goTargets = append(goTargets, t)
		}
		present = append(present, t)
	}
	if len(present) == 0 {
		return fmt.Errorf("nothing to build: none of %s exists under %s", *only, root)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	binDir, err := os.MkdirTemp("", "ms2m-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	if len(goTargets) > 0 {
		if err := goBuild(ctx, root, binDir, goTargets, stderr); err != nil {
			return err
		}
	}

	idx := buildIndex{Tag: *tag}
	for _, t := range present {
		var img v1.Image
		if t.script != "" {
			img, err = pythonImage(root, t, pyOpts[t.name])
		} else {
			img, err = ociimage.App(ociimage.AppOptions{
				Binaries: []string{filepath.Join(binDir, t.name)},
				Labels:   map[string]string{"org.opencontainers.image.title": t.name},
			})
		}
		if err != nil {
			return fmt.Errorf("image %s: %w", t.name, err)
		}
		ref := t.ref(*tag)
		tarName := t.name + ".tar"
		if err := ociimage.WriteTarball(filepath.Join(*out, tarName), ref, img); err != nil {
			return err
		}
		if err := ociimage.WriteOCILayout(filepath.Join(*out, "oci"), ref, img); err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		size, err := imageSize(img)
		if err != nil {
			return fmt.Errorf("image %s: %w", t.name, err)
		}
		idx.Images = append(idx.Images, builtImage{Name: t.name, Ref: ref, Digest: digest.String(), Size: size, Tarball: tarName})
	}
	if err := writeIndex(*out, idx); err != nil {
		return err
	}
	printTable(stdout, idx.Images)
	return nil
}

// pythonAppDir is where a Python image keeps its program.
const pythonAppDir = "/app"

// pythonImage builds the image of a Python target from opts, the file set
// of Debian's python3 and the target's packages: the script goes into
// /app under its own name, run by Debian's python3 as user 65532.
func pythonImage(root string, t target, opts ociimage.FilesOptions) (v1.Image, error) {
	data, err := os.ReadFile(filepath.Join(root, t.script))
	if err != nil {
		return nil, err
	}
	script := path.Join(pythonAppDir, filepath.Base(t.script))
	opts.Files = append(opts.Files, ociimage.File{Path: script, Mode: 0o644, Data: data})
	opts.Entrypoint = []string{debianpy.Interpreter, script}
	opts.User = ociimage.NonRootUser
	opts.WorkingDir = pythonAppDir
	opts.Labels = map[string]string{"org.opencontainers.image.title": t.name}
	return ociimage.Files(opts)
}

// goBuild builds the targets' main packages, static, into dir.
func goBuild(ctx context.Context, root, dir string, ts []target, stderr io.Writer) error {
	args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + string(filepath.Separator)}
	for _, t := range ts {
		args = append(args, t.pkg)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// moduleRoot is the directory of the main module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module; run images from the ms2m checkout")
	}
	return filepath.Dir(gomod), nil
}

// imageSize is what a pull of img transfers: manifest, config and layers.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}

func writeIndex(dir string, idx buildIndex) error {
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, indexFile), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", indexFile, err)
	}
	return nil
}

func readIndex(dir string) (buildIndex, error) {
	var idx buildIndex
	data, err := os.ReadFile(filepath.Join(dir, indexFile))
	if err != nil {
		return idx, fmt.Errorf("read %s: %w; run `images build -o %s` first", indexFile, err, dir)
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return idx, fmt.Errorf("%s: %w", filepath.Join(dir, indexFile), err)
	}
	return idx, nil
}

func printTable(w io.Writer, imgs []builtImage) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREF\tDIGEST\tSIZE")
	for _, i := range imgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", i.Name, i.Ref, i.Digest, humanSize(i.Size))
	}
	tw.Flush()
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func cmdPush(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	registry := fs.String("registry", "", "registry HOST:PORT to push to (required)")
	from := fs.String("from", "", "directory written by `images build -o` (required)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry (loopback and private addresses use it anyway)")
	auth := fs.String("auth", "", "docker config.json with credentials for the registry (default anonymous)")
	only := fs.String("only", "", "comma-separated images to push (default all that were built)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *registry == "" {
		return usagef("-registry is required: the HOST:PORT to push to")
	}
	if strings.Contains(*registry, "/") {
		return usagef("-registry %q: give HOST:PORT only, without a scheme or path", *registry)
	}
	if *from == "" {
		return usagef("-from is required: the directory `images build -o` wrote")
	}
	idx, err := readIndex(*from)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	if *only != "" {
		for _, n := range strings.Split(*only, ",") {
			want[strings.TrimSpace(n)] = true
		}
	}
	lay, err := layout.ImageIndexFromPath(filepath.Join(*from, "oci"))
	if err != nil {
		return fmt.Errorf("read OCI layout in %s: %w", *from, err)
	}
	var pushed []builtImage
	for _, bi := range idx.Images {
		if len(want) > 0 && !want[bi.Name] {
			continue
		}
		delete(want, bi.Name)
		img, err := imageByRef(lay, bi.Ref)
		if err != nil {
			return fmt.Errorf("%s: %w", bi.Name, err)
		}
		dest, err := destRef(*registry, bi.Ref)
		if err != nil {
			return fmt.Errorf("%s: %w", bi.Name, err)
		}
		if err := ociimage.Push(ctx, img, dest, ociimage.PushOptions{Insecure: *insecure, AuthFile: *auth}); err != nil {
			return err
		}
		bi.Ref = dest
		pushed = append(pushed, bi)
	}
	if len(want) > 0 {
		missing := slices.Sorted(maps.Keys(want))
		return usagef("-only: %s not in %s", strings.Join(missing, ", "), filepath.Join(*from, indexFile))
	}
	printTable(stdout, pushed)
	return nil
}

// imageByRef finds the image named ref in an OCI layout.
func imageByRef(idx v1.ImageIndex, ref string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range im.Manifests {
		if d.Annotations[ociimage.AnnotationRefName] == ref {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no image named %s in the OCI layout; rebuild with `images build`", ref)
}

// destRef moves ref to registry, keeping its repository path and tag:
// ms2m/sidecar:dev becomes HOST:PORT/ms2m/sidecar:dev and
// registry.k8s.io/pause:3.10 becomes HOST:PORT/pause:3.10, the paths a
// containerd mirror of either registry asks for.
func destRef(registry, ref string) (string, error) {
	t, err := name.NewTag(ref)
	if err != nil {
		return "", fmt.Errorf("ref %q: %w", ref, err)
	}
	return registry + "/" + t.RepositoryStr() + ":" + t.TagStr(), nil
}
