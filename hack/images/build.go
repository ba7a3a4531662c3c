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
	// ownMultiArch marks ms2m's own images: built for every -platforms
	// platform and written and pushed as one image index. The others are
	// one linux/amd64 image.
	ownMultiArch bool
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
	{name: "sidecar", pkg: "./cmd/sidecar", ref: ms2mRef("sidecar"), ownMultiArch: true},
	{name: "webhook", pkg: "./cmd/webhook", ref: ms2mRef("webhook"), ownMultiArch: true},
	{name: "migrator", pkg: "./cmd/migrator", ref: ms2mRef("migrator"), ownMultiArch: true},
	{name: "consumer", pkg: "./examples/consumer", ref: ms2mRef("consumer")},
	{name: "producer", pkg: "./examples/producer", ref: ms2mRef("producer")},
	// The unmodified Python consumer, on the host's own Debian python3.
	{name: "consumer-python", script: "examples/consumer-python/consumer.py", pythonPackages: []string{"pika"}, ref: ms2mRef("consumer-python")},
	// The sandbox image containerd pins; the tag is the image's, not ours.
	{name: "pause", pkg: "./hack/pause", ref: func(string) string { return "registry.k8s.io/pause:3.10" }},
}

// singlePlatform is the platform of the images that are not ms2m's own.
var singlePlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// platformsOf are the platforms t is built for: all of platforms for one
// of ms2m's own images, else singlePlatform (Python's from the host).
func platformsOf(t target, platforms []v1.Platform) []v1.Platform {
	if t.ownMultiArch {
		return platforms
	}
	return []v1.Platform{singlePlatform}
}

// goBuildStep is one go build: the main packages of ts for one platform.
type goBuildStep struct {
	platform v1.Platform
	targets  []target
}

// goBuildPlan groups the Go targets by platform, one go build each, in the
// order the platforms first appear.
func goBuildPlan(ts []target, platforms []v1.Platform) []goBuildStep {
	var steps []goBuildStep
	for _, t := range ts {
		if t.pkg == "" {
			continue
		}
		for _, p := range platformsOf(t, platforms) {
			i := slices.IndexFunc(steps, func(s goBuildStep) bool { return s.platform.Equals(p) })
			if i < 0 {
				steps = append(steps, goBuildStep{platform: p})
				i = len(steps) - 1
			}
			steps[i].targets = append(steps[i].targets, t)
		}
	}
	return steps
}

// tarballPlatform is the platform whose image goes into a target's
// docker-archive, which holds one image: the host's, if it was built, so
// that `ctr images import` on this machine gets the one it runs.
func tarballPlatform(built []v1.Platform, host v1.Platform) v1.Platform {
	if slices.ContainsFunc(built, host.Equals) {
		return host
	}
	return built[0]
}

// binDirFor is where go build puts a platform's binaries under dir.
func binDirFor(dir string, p v1.Platform) string {
	return filepath.Join(dir, p.OS+"_"+p.Architecture)
}

// indexFile lists what build wrote; push reads it.
const indexFile = "images.json"

type buildIndex struct {
	Tag    string       `json:"tag"`
	Images []builtImage `json:"images"`
}

type builtImage struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
	// Digest is the image's, or the image index's for one of ms2m's own.
	Digest string `json:"digest"`
	// Size is what a pull for the tarball's platform moves: manifest,
	// config and layers (and the index, for one of ms2m's own).
	Size int64 `json:"size"`
	// Platforms are the os/arch the image was built for, comma separated.
	Platforms string `json:"platforms"`
	// Tarball is a docker-archive of the TarballPlatform image, relative
	// to the output directory.
	Tarball         string `json:"tarball"`
	TarballPlatform string `json:"tarballPlatform"`
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

// ownNames are the names of ms2m's own images, the multi-arch ones.
func ownNames() []string {
	var names []string
	for _, t := range targets {
		if t.ownMultiArch {
			names = append(names, t.name)
		}
	}
	return names
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
	platformList := fs.String("platforms", ociimage.FormatPlatforms(ociimage.DefaultPlatforms),
		"comma-separated os/arch (or host) that ms2m's own images ("+strings.Join(ownNames(), ", ")+") are built for, as one image index; the others are "+singlePlatform.String())
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	platforms, err := ociimage.ParsePlatforms(*platformList)
	if err != nil {
		return usagef("-platforms: %v", err)
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
	var present []target
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
	for _, step := range goBuildPlan(present, platforms) {
		if err := goBuild(ctx, root, binDirFor(binDir, step.platform), step, stderr); err != nil {
			return err
		}
	}

	idx := buildIndex{Tag: *tag}
	for _, t := range present {
		bi, err := writeImage(root, binDir, *out, *tag, t, platforms, pyOpts[t.name])
		if err != nil {
			return fmt.Errorf("image %s: %w", t.name, err)
		}
		idx.Images = append(idx.Images, bi)
	}
	if err := writeIndex(*out, idx); err != nil {
		return err
	}
	printTable(stdout, idx.Images)
	return nil
}

// writeImage makes t's image from the binaries under binDir (or its
// script), or one of ms2m's own for each of platforms as an image index,
// and writes it to out: the OCI layout, and the tarball of the host's
// platform.
func writeImage(root, binDir, out, tag string, t target, platforms []v1.Platform, pyOpts ociimage.FilesOptions) (builtImage, error) {
	ref := t.ref(tag)
	built := platformsOf(t, platforms)
	imgs := make([]v1.Image, 0, len(built))
	for _, p := range built {
		var img v1.Image
		var err error
		if t.script != "" {
			img, err = pythonImage(root, t, pyOpts)
		} else {
			img, err = ociimage.App(ociimage.AppOptions{
				Binaries: []string{filepath.Join(binDirFor(binDir, p), t.name)},
				Arch:     p.Architecture,
				Labels:   map[string]string{"org.opencontainers.image.title": t.name},
			})
		}
		if err != nil {
			return builtImage{}, err
		}
		imgs = append(imgs, img)
	}
	tarPlatform := tarballPlatform(built, ociimage.HostPlatform())
	tarImg := imgs[slices.IndexFunc(built, tarPlatform.Equals)]
	bi := builtImage{Name: t.name, Ref: ref, Platforms: ociimage.FormatPlatforms(built), Tarball: t.name + ".tar", TarballPlatform: tarPlatform.String()}
	if err := ociimage.WriteTarball(filepath.Join(out, bi.Tarball), ref, tarImg); err != nil {
		return builtImage{}, err
	}
	size, err := imageSize(tarImg)
	if err != nil {
		return builtImage{}, err
	}
	var digest v1.Hash
	if t.ownMultiArch {
		idx, err := ociimage.Index(imgs...)
		if err != nil {
			return builtImage{}, err
		}
		if err := ociimage.WriteOCILayoutIndex(filepath.Join(out, "oci"), ref, idx); err != nil {
			return builtImage{}, err
		}
		if digest, err = idx.Digest(); err != nil {
			return builtImage{}, err
		}
		n, err := idx.Size()
		if err != nil {
			return builtImage{}, err
		}
		size += n
	} else {
		if err := ociimage.WriteOCILayout(filepath.Join(out, "oci"), ref, tarImg); err != nil {
			return builtImage{}, err
		}
		if digest, err = tarImg.Digest(); err != nil {
			return builtImage{}, err
		}
	}
	bi.Digest, bi.Size = digest.String(), size
	return bi, nil
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

// goBuild builds the step's main packages, static, for its platform into
// dir.
func goBuild(ctx context.Context, root, dir string, step goBuildStep, stderr io.Writer) error {
	args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + string(filepath.Separator)}
	for _, t := range step.targets {
		args = append(args, t.pkg)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+step.platform.OS, "GOARCH="+step.platform.Architecture)
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
	fmt.Fprintln(tw, "NAME\tREF\tDIGEST\tSIZE\tPLATFORMS")
	for _, i := range imgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", i.Name, i.Ref, i.Digest, humanSize(i.Size), i.Platforms)
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
		desc, err := descByRef(lay, bi.Ref)
		if err != nil {
			return fmt.Errorf("%s: %w", bi.Name, err)
		}
		dest, err := destRef(*registry, bi.Ref)
		if err != nil {
			return fmt.Errorf("%s: %w", bi.Name, err)
		}
		if err := pushDesc(ctx, lay, desc, dest, ociimage.PushOptions{Insecure: *insecure, AuthFile: *auth}); err != nil {
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

// descByRef finds the image or image index named ref in an OCI layout.
func descByRef(idx v1.ImageIndex, ref string) (v1.Descriptor, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	for _, d := range im.Manifests {
		if d.Annotations[ociimage.AnnotationRefName] == ref {
			return d, nil
		}
	}
	return v1.Descriptor{}, fmt.Errorf("no image named %s in the OCI layout; rebuild with `images build`", ref)
}

// pushDesc pushes what desc names in the layout to dest: an image index
// with its images, or an image.
func pushDesc(ctx context.Context, lay v1.ImageIndex, desc v1.Descriptor, dest string, o ociimage.PushOptions) error {
	if desc.MediaType.IsIndex() {
		idx, err := lay.ImageIndex(desc.Digest)
		if err != nil {
			return fmt.Errorf("%s: %w", dest, err)
		}
		return ociimage.PushIndex(ctx, idx, dest, o)
	}
	img, err := lay.Image(desc.Digest)
	if err != nil {
		return fmt.Errorf("%s: %w", dest, err)
	}
	return ociimage.Push(ctx, img, dest, o)
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
