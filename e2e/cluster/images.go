package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/v1/tarball"

	nodeagent "github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/ociimage"
)

// ensurePauseImage builds the sandbox image once into the state folder:
// hack/pause, a static binary that waits for a signal, as an image tagged
// PauseImage. Nothing can be pulled on this machine, so every node imports
// it.
func ensurePauseImage(ctx context.Context, l layout, opts Options) error {
	if _, err := os.Stat(l.pauseTarball()); err == nil {
		return nil
	}
	bin := l.path("bin", "pause")
	if err := goBuild(ctx, opts.RepoDir, "github.com/ms2m/ms2m/hack/pause", bin); err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	img, err := ociimage.App(ociimage.AppOptions{Binaries: []string{bin}, User: "0:0"})
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	if err := ociimage.WriteTarball(l.pauseTarball(), PauseImage, img); err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	return nil
}

// pushPauseImage pushes the pause image's tarball to the cluster's
// registry as crioPauseImage, where CRI-O nodes pull it from.
func pushPauseImage(ctx context.Context, l layout) error {
	img, err := tarball.ImageFromPath(l.pauseTarball(), nil)
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	if err := ociimage.Push(ctx, img, crioPauseImage(), ociimage.PushOptions{Insecure: true}); err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	return nil
}

// criPull pulls ref through the CRI image service at sock, as the kubelet
// does: with the runtime's own registry settings.
func criPull(ctx context.Context, sock, ref string) error {
	return nodeagent.CRIPuller{Endpoint: sock}.Pull(ctx, ref, nil)
}

// ensureHelper puts the host-services helper at a stable path in the state
// folder: a copy of opts.Helper, or hack/cluster built from the repository.
// A `go run` binary is deleted when go run exits, hence the copy.
func ensureHelper(ctx context.Context, l layout, opts Options) (string, error) {
	dst := l.helperBinary()
	if opts.Helper == "" {
		if err := goBuild(ctx, opts.RepoDir, "github.com/ms2m/ms2m/hack/cluster", dst); err != nil {
			return "", fmt.Errorf("host-services helper: %w", err)
		}
		return dst, nil
	}
	if err := copyExecutable(opts.Helper, dst); err != nil {
		return "", fmt.Errorf("host-services helper: %w", err)
	}
	return dst, nil
}

// goBuild builds a main package, statically, into out. Up calls it only
// while no copy of out runs. go build leaves an up-to-date out alone, which
// saves the link (seconds for a binary with client-go in it).
func goBuild(ctx context.Context, repo, pkg, out string) error {
	if repo == "" {
		return fmt.Errorf("build %s: the repository root is unknown; run from inside the repository or set Options.RepoDir", pkg)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
