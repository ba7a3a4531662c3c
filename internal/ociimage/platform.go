package ociimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"runtime"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// archMachine is the ELF machine of each architecture App builds for: the
// ones Go cross-compiles a static binary for that ms2m ships.
var archMachine = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// DefaultPlatforms are the platforms ms2m's own images are built for, in
// the order their manifests take in the image index.
var DefaultPlatforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64"},
}

// HostPlatform is linux on the architecture this program runs on: the one
// a build for the local nodes needs.
func HostPlatform() v1.Platform {
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

// ParsePlatforms reads a comma-separated list of os/arch platforms, such
// as "linux/amd64,linux/arm64", in order. "host" stands for HostPlatform.
// It refuses an empty list, a duplicate, an OS other than linux and an
// architecture App cannot build for.
func ParsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p := HostPlatform()
		if f != "host" {
			osName, arch, ok := strings.Cut(f, "/")
			if !ok || strings.Contains(arch, "/") {
				return nil, fmt.Errorf("platform %q: want os/arch, such as linux/arm64", f)
			}
			p = v1.Platform{OS: osName, Architecture: arch}
		}
		if err := checkPlatform(p); err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, p.Equals) {
			return nil, fmt.Errorf("platform %s given twice", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no platform given; want os/arch, such as linux/amd64,linux/arm64")
	}
	return out, nil
}

// FormatPlatforms is the list ParsePlatforms reads back.
func FormatPlatforms(ps []v1.Platform) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func checkPlatform(p v1.Platform) error {
	if p.OS != "linux" {
		return fmt.Errorf("platform %s: only linux images are built", p)
	}
	if _, ok := archMachine[p.Architecture]; !ok {
		return fmt.Errorf("platform %s: architecture %q is not one of %s", p, p.Architecture, strings.Join(supportedArchs(), ", "))
	}
	if p.Variant != "" || p.OSVersion != "" || len(p.OSFeatures) > 0 || len(p.Features) > 0 {
		return fmt.Errorf("platform %s: give os/arch only", p)
	}
	return nil
}

func supportedArchs() []string {
	out := make([]string, 0, len(archMachine))
	for a := range archMachine {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// Index puts images of one program, one per platform, together as an OCI
// image index, in the order given. Each manifest's descriptor carries the
// platform its image's config names, so that a node pulls the one for its
// own platform by the index's reference. It refuses no images, an image
// whose config names no OS or architecture, and two of one platform.
func Index(imgs ...v1.Image) (v1.ImageIndex, error) {
	if len(imgs) == 0 {
		return nil, errors.New("image index: no images given")
	}
	adds := make([]mutate.IndexAddendum, 0, len(imgs))
	seen := make([]v1.Platform, 0, len(imgs))
	for i, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("image index: image %d: read config: %w", i, err)
		}
		p := cf.Platform()
		if p == nil || p.OS == "" || p.Architecture == "" {
			return nil, fmt.Errorf("image index: image %d: its config names no os and architecture", i)
		}
		if slices.ContainsFunc(seen, p.Equals) {
			return nil, fmt.Errorf("image index: two images for %s", p)
		}
		seen = append(seen, *p)
		mt, err := img.MediaType()
		if err != nil {
			return nil, fmt.Errorf("image index: image %d: %w", i, err)
		}
		adds = append(adds, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: mt, Platform: p},
		})
	}
	base := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	return mutate.AppendManifests(base, adds...), nil
}

// IndexEntry is one image of an index, as a node of its platform gets it.
type IndexEntry struct {
	// Platform is what the index's descriptor says.
	Platform v1.Platform
	Digest   v1.Hash
	// Config is the os/arch the image's config says.
	Config v1.Platform
	// Entrypoint is the config's first entrypoint word, and Machine the
	// ELF machine of that file in the image (zero when it is not an ELF
	// file or not in the image).
	Entrypoint string
	Machine    elf.Machine
}

// Check says what of e does not fit its platform: a config of another
// platform, or an entrypoint that is not an executable for its machine.
func (e IndexEntry) Check() error {
	if e.Config.OS != e.Platform.OS || e.Config.Architecture != e.Platform.Architecture {
		return fmt.Errorf("%s: the index says %s, the config %s/%s", e.Digest, e.Platform, e.Config.OS, e.Config.Architecture)
	}
	want, ok := archMachine[e.Platform.Architecture]
	if !ok {
		return fmt.Errorf("%s: architecture %q is not one of %s", e.Digest, e.Platform.Architecture, strings.Join(supportedArchs(), ", "))
	}
	if e.Machine != want {
		return fmt.Errorf("%s (%s): entrypoint %s is for %v, want %v", e.Digest, e.Platform, e.Entrypoint, e.Machine, want)
	}
	return nil
}

// InspectIndex reads every image idx names: its platform in the index,
// its config's, and the ELF machine of its entrypoint.
func InspectIndex(idx v1.ImageIndex) ([]IndexEntry, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index manifest: %w", err)
	}
	out := make([]IndexEntry, 0, len(im.Manifests))
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", d.Digest, err)
		}
		e, err := inspectImage(img, d.Digest)
		if err != nil {
			return nil, err
		}
		e.Platform = v1.Platform{}
		if d.Platform != nil {
			e.Platform = *d.Platform
		}
		out = append(out, e)
	}
	return out, nil
}

// inspectImage is the entry of img, whose manifest has digest, with the
// platform its config says.
func inspectImage(img v1.Image, digest v1.Hash) (IndexEntry, error) {
	e := IndexEntry{Digest: digest}
	cf, err := img.ConfigFile()
	if err != nil {
		return e, fmt.Errorf("image %s: read config: %w", digest, err)
	}
	e.Config = v1.Platform{OS: cf.OS, Architecture: cf.Architecture}
	e.Platform = e.Config
	if len(cf.Config.Entrypoint) > 0 {
		e.Entrypoint = cf.Config.Entrypoint[0]
		data, err := ReadImageFile(img, e.Entrypoint)
		if err != nil {
			return e, fmt.Errorf("image %s: %w", digest, err)
		}
		if f, err := elf.NewFile(bytes.NewReader(data)); err == nil {
			e.Machine = f.Machine
		}
	}
	return e, nil
}

// ReadImageFile is the content of the regular file at the absolute path p
// in img's flattened filesystem.
func ReadImageFile(img v1.Image, p string) ([]byte, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	want := strings.TrimPrefix(path.Clean(p), "/")
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("no file %s in the image", p)
		}
		if err != nil {
			return nil, fmt.Errorf("read the image's files: %w", err)
		}
		if strings.TrimPrefix(path.Clean(h.Name), "/") == want && h.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}
