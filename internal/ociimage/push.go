package ociimage

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// PushOptions tune Push.
type PushOptions struct {
	// Insecure allows plain HTTP to the registry. Loopback, localhost and
	// private (RFC 1918) addresses use plain HTTP even without it.
	Insecure bool
	// AuthFile is the path of a docker config.json whose "auths" entry for
	// the registry's host gives the credentials. Empty means anonymous.
	AuthFile string
	// Jobs is how many blobs upload at once; 0 means the library default.
	Jobs int
}

// Push pushes img to ref, a tag or digest reference with a registry host
// (for example 127.0.0.1:5000/ms2m/sidecar:dev). It returns when the
// manifest is in the registry, or when ctx ends.
func Push(ctx context.Context, img v1.Image, ref string, o PushOptions) error {
	r, ropts, err := remoteTarget(ctx, ref, o)
	if err != nil {
		return fmt.Errorf("push %w", err)
	}
	if err := remote.Write(r, img, ropts...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// PushIndex pushes an image index and every image it names to ref, as
// Push does one image: the images first, then the index, so that ref
// resolves only once all of it is there.
func PushIndex(ctx context.Context, idx v1.ImageIndex, ref string, o PushOptions) error {
	r, ropts, err := remoteTarget(ctx, ref, o)
	if err != nil {
		return fmt.Errorf("push %w", err)
	}
	if err := remote.WriteIndex(r, idx, ropts...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// Inspection is what a reference names in its registry.
type Inspection struct {
	// Index is set when the reference names an image index; Digest is
	// the index's or the image's manifest digest.
	Index   bool
	Digest  v1.Hash
	Entries []IndexEntry
}

// Inspect reads what ref names in its registry: for an image index, an
// entry per image it names (InspectIndex); for an image, its one entry,
// whose platform is its config's.
func Inspect(ctx context.Context, ref string, o PushOptions) (Inspection, error) {
	r, ropts, err := remoteTarget(ctx, ref, o)
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect %w", err)
	}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect %s: %w", ref, err)
	}
	in := Inspection{Index: desc.MediaType.IsIndex(), Digest: desc.Digest}
	if in.Index {
		idx, err := desc.ImageIndex()
		if err == nil {
			in.Entries, err = InspectIndex(idx)
		}
		if err != nil {
			return Inspection{}, fmt.Errorf("inspect %s: %w", ref, err)
		}
		return in, nil
	}
	img, err := desc.Image()
	var e IndexEntry
	if err == nil {
		e, err = inspectImage(img, desc.Digest)
	}
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect %s: %w", ref, err)
	}
	in.Entries = []IndexEntry{e}
	return in, nil
}

// remoteTarget parses ref and gives the options of a request to its
// registry: ctx, the credentials of o.AuthFile and o.Jobs.
func remoteTarget(ctx context.Context, ref string, o PushOptions) (name.Reference, []remote.Option, error) {
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("ref %q: %w", ref, err)
	}
	auth := authn.Anonymous
	if o.AuthFile != "" {
		if auth, err = authFromConfig(o.AuthFile, r.Context().RegistryStr()); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth)}
	if o.Jobs > 0 {
		ropts = append(ropts, remote.WithJobs(o.Jobs))
	}
	return r, ropts, nil
}

// Delete deletes the image at ref (a tag or a digest) from its registry: a
// tag is resolved to its manifest, and the manifest goes, with every tag of
// it. An image that is not there is no error.
func Delete(ctx context.Context, ref string, o PushOptions) error {
	r, ropts, err := remoteTarget(ctx, ref, PushOptions{Insecure: o.Insecure, AuthFile: o.AuthFile})
	if err != nil {
		return fmt.Errorf("delete %w", err)
	}
	tag, isTag := r.(name.Tag)
	if isTag {
		desc, err := remote.Head(r, ropts...)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("delete %s: resolve the tag: %w", ref, err)
		}
		r = r.Context().Digest(desc.Digest.String())
	}
	if err := remote.Delete(r, ropts...); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	if isTag {
		// Most registries drop a manifest's tags with it; those that keep
		// a tag as its own entry take a delete of the tag (OCI 1.1), which
		// the others refuse: either way the tag resolves no more, so the
		// refusal is no failure.
		_ = remote.Delete(tag, ropts...)
	}
	return nil
}

// isNotFound reports whether err is the registry's 404.
func isNotFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

// dockerConfig is the part of a docker config.json that Push reads.
type dockerConfig struct {
	Auths map[string]dockerAuth `json:"auths"`
}

type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// authFromConfig returns the credentials for host from the docker
// config.json at path. A config without an entry for host is an error, so
// that a typo does not silently push anonymously.
func authFromConfig(path, host string) (authn.Authenticator, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read auth file: %w", err)
	}
	cfg, err := parseDockerConfig(data, host)
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	return authn.FromConfig(cfg), nil
}

// parseDockerConfig finds host among the "auths" keys of a docker
// config.json, ignoring a scheme and a path on the key
// ("https://host/v1/" matches "host").
func parseDockerConfig(data []byte, host string) (authn.AuthConfig, error) {
	var cfg dockerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return authn.AuthConfig{}, fmt.Errorf("not a docker config.json: %w", err)
	}
	for key, a := range cfg.Auths {
		if authKeyHost(key) != host {
			continue
		}
		out := authn.AuthConfig{
			Username:      a.Username,
			Password:      a.Password,
			IdentityToken: a.IdentityToken,
			RegistryToken: a.RegistryToken,
		}
		if a.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return authn.AuthConfig{}, fmt.Errorf("auths[%q].auth is not base64: %w", key, err)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return authn.AuthConfig{}, fmt.Errorf("auths[%q].auth is not user:password", key)
			}
			out.Username, out.Password = user, pass
		}
		return out, nil
	}
	return authn.AuthConfig{}, fmt.Errorf("no auths entry for registry %q; add one or push anonymously", host)
}

func authKeyHost(key string) string {
	if _, rest, ok := strings.Cut(key, "://"); ok {
		key = rest
	}
	host, _, _ := strings.Cut(key, "/")
	return host
}
