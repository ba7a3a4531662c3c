package ociimage

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// NonRootUser is the default user of an App image: the "nonroot" entry of
	// its /etc/passwd.
	NonRootUser = "65532:65532"
	// DefaultPath is the PATH of an App image unless AppOptions.Env sets one.
	// The binaries sit at the root, so "/" comes first.
	DefaultPath = "PATH=/:/usr/local/bin:/usr/bin:/bin"

	passwdFile = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	groupFile = "root:x:0:\nnonroot:x:65532:\n"
)

// AppOptions describes an application image made of static binaries.
type AppOptions struct {
	// Binaries are host paths of static Linux executables for Arch. Each
	// one lands at /<basename> with mode 0755. At least one is required.
	Binaries []string
	// Arch is the image's architecture, which every binary must be built
	// for: amd64 (the default) or arm64.
	Arch string
	// Entrypoint defaults to ["/"+basename(Binaries[0])].
	Entrypoint []string
	// User defaults to NonRootUser. "0:0" is allowed, for a pause image.
	User string
	// Env is added to the config. A PATH is added unless Env has one.
	Env []string
	// Labels go into the image config.
	Labels map[string]string
	// Created is the config's and the layer's timestamp. Zero means the
	// Unix epoch, so that the same binaries give the same digest.
	Created time.Time
}

// App builds a small linux image for opts.Arch from static binaries: an empty base
// with /etc/passwd and /etc/group naming a non-root user 65532 "nonroot", a
// /tmp with mode 1777, and each binary at /<basename>. The config carries
// the entrypoint, the user, the environment, WorkingDir "/" and the labels.
// The layer is a deterministic tar (sorted entries, fixed times, owner 0:0
// except /tmp, which the image's user owns when it is numeric).
func App(opts AppOptions) (v1.Image, error) {
	if len(opts.Binaries) == 0 {
		return nil, errors.New("app image: no binaries given; pass at least one static executable")
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	arch := opts.Arch
	if arch == "" {
		arch = "amd64"
	}
	if err := checkPlatform(v1.Platform{OS: "linux", Architecture: arch}); err != nil {
		return nil, fmt.Errorf("app image: %w", err)
	}
	user := opts.User
	if user == "" {
		user = NonRootUser
	}
	uid, gid, err := parseNumericUser(user)
	if err != nil {
		return nil, fmt.Errorf("app image: %w", err)
	}

	files := make([]appFile, 0, len(opts.Binaries))
	seen := map[string]string{}
	for _, p := range opts.Binaries {
		base := filepath.Base(p)
		if prev, ok := seen[base]; ok {
			return nil, fmt.Errorf("app image: binaries %s and %s would both land at /%s; rename one", prev, p, base)
		}
		seen[base] = p
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("app image: read binary: %w", err)
		}
		if err := checkStatic(data, arch); err != nil {
			return nil, fmt.Errorf("app image: binary %s: %w", p, err)
		}
		files = append(files, appFile{name: base, data: data})
	}

	layerTar, err := appLayerTar(files, created, uid, gid)
	if err != nil {
		return nil, fmt.Errorf("app image: write layer: %w", err)
	}
	layer, err := layerFromTar(layerTar, false)
	if err != nil {
		return nil, fmt.Errorf("app image: compress layer: %w", err)
	}

	entrypoint := opts.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{"/" + files[0].name}
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.name
	}
	cfg := v1.Config{
		Entrypoint: append([]string(nil), entrypoint...),
		User:       user,
		Env:        withPath(opts.Env),
		WorkingDir: "/",
		Labels:     copyMap(opts.Labels),
	}
	return assemble(layer, arch, cfg, created, "ociimage.App: "+strings.Join(names, " "), nil)
}

// assemble puts one layer on an empty OCI base and sets a config for linux
// on arch and, when given, manifest annotations.
func assemble(layer v1.Layer, arch string, cfg v1.Config, created time.Time, createdBy string, annotations map[string]string) (v1.Image, error) {
	mt, err := layer.MediaType()
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: mt,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: createdBy},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = arch
	cf.OS = "linux"
	cf.Created = v1.Time{Time: created}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	if len(annotations) > 0 {
		ai, ok := mutate.Annotations(img, annotations).(v1.Image)
		if !ok {
			return nil, errors.New("annotate manifest: result is not an image")
		}
		img = ai
	}
	return img, nil
}

type appFile struct {
	name string
	data []byte
}

// appLayerTar writes the root filesystem of an App image as a tar. The same
// files, time and owner give the same bytes.
func appLayerTar(files []appFile, mtime time.Time, tmpUID, tmpGID int) ([]byte, error) {
	entries := baseEntries(tmpUID, tmpGID)
	for _, f := range files {
		entries = append(entries, fileEntry(f.name, 0o755, f.data))
	}
	return writeLayerTar(entries, mtime)
}

// checkStatic rejects anything that is not a statically linked ELF
// executable for arch, since the image has no dynamic loader and no libc
// and a node runs only its own architecture's binaries.
func checkStatic(data []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF executable (%v); build it for linux/%s", err, arch)
	}
	defer f.Close()
	if want := archMachine[arch]; f.Machine != want {
		return fmt.Errorf("machine is %v, want %v; build with GOARCH=%s", f.Machine, want, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked; build with CGO_ENABLED=0")
		}
	}
	return nil
}

// parseNumericUser returns the uid and gid of "uid[:gid]", or 0, 0 for a
// user given by name. It only rejects malformed numbers.
func parseNumericUser(user string) (uid, gid int, err error) {
	u, g, hasGroup := strings.Cut(user, ":")
	uid, uerr := strconv.Atoi(u)
	if uerr != nil {
		return 0, 0, nil // a name: /tmp stays root's, mode 1777 lets anyone write
	}
	if uid < 0 {
		return 0, 0, fmt.Errorf("user %q: negative uid", user)
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
			return 0, 0, fmt.Errorf("user %q: group must be a number when the user is one", user)
		}
	}
	return uid, gid, nil
}

func withPath(env []string) []string {
	out := append([]string(nil), env...)
	for _, e := range out {
		if strings.HasPrefix(e, "PATH=") {
			return out
		}
	}
	return append([]string{DefaultPath}, out...)
}

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
