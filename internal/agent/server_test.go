package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/ociimage"
)

type recordingPuller struct {
	refs  []string
	auths []*contract.RegistryAuth
}

func (p *recordingPuller) Pull(_ context.Context, ref string, auth *contract.RegistryAuth) error {
	if strings.Contains(ref, "missing") {
		return errors.New("not found in the registry")
	}
	p.refs = append(p.refs, ref)
	p.auths = append(p.auths, auth)
	return nil
}

// setup serves an agent over a checkpoint folder with one archive, and a
// registry on loopback.
func setup(t *testing.T, opts ...func(*Config)) (Client, string, string, *recordingPuller) {
	t.Helper()
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "checkpoints")
	logs := filepath.Join(dir, "state")
	for _, d := range []string{ckpt, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	archive := filepath.Join(ckpt, "checkpoint-app_default-app-2026.tar")
	writeArchive(t, archive, Origin{Namespace: "default", Pod: "app", Container: "app"})
	if err := os.WriteFile(filepath.Join(logs, "criu-dump.log"), []byte("(00.1) Error (criu/x.c:1): it broke\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret.log"), []byte("outside\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "secret.log"), filepath.Join(logs, "escape.log")); err != nil {
		t.Fatal(err)
	}

	reg, err := ociimage.ServeRegistry("127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	p := &recordingPuller{}
	cfg := Config{CheckpointDir: ckpt, LogDirs: []string{logs}, Token: "tok", Push: ociimage.PushOptions{Insecure: true}, Puller: p, Repository: reg.Addr() + "/ckpt"}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c := Client{Token: "tok", Resolve: func(_ context.Context, node string) (string, error) {
		if node != "node-1" {
			return "", errors.New("no such node")
		}
		return srv.URL, nil
	}}
	return c, archive, reg.Addr(), p
}

func TestBuildCheckpointImage(t *testing.T) {
	c, archive, reg, _ := setup(t)
	ctx := t.Context()
	img, err := c.BuildCheckpointImage(ctx, "node-1", archive, "app", reg+"/ckpt/default:m1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(img, reg+"/ckpt/default@sha256:") {
		t.Fatalf("image %q, want it by digest in %s/ckpt/default", img, reg)
	}
	ref, _ := name.ParseReference(img)
	pulled, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pull back %s: %v", img, err)
	}
	m, err := pulled.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Annotations[ociimage.AnnotationCheckpointContainerd] != "app" || m.Annotations[ociimage.AnnotationCheckpointCRIO] != "app" {
		t.Errorf("manifest annotations %v: want both checkpoint annotations naming app", m.Annotations)
	}
	// Relative to the checkpoint folder works too (the first push removed
	// the archive: the kubelet writes a new one per checkpoint).
	writeArchive(t, archive, Origin{Namespace: "default", Pod: "app", Container: "app"})
	if _, err := c.BuildCheckpointImage(ctx, "node-1", filepath.Base(archive), "app", reg+"/ckpt/default:m2"); err != nil {
		t.Errorf("relative archive path: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	c, archive, reg, p := setup(t)
	ctx := t.Context()
	for name, call := range map[string]struct {
		do   func() error
		want string
	}{
		"archive outside the folder": {func() error {
			_, err := c.BuildCheckpointImage(ctx, "node-1", "/etc/passwd", "app", reg+"/x:1")
			return err
		}, "outside"},
		"archive via ..": {func() error {
			_, err := c.BuildCheckpointImage(ctx, "node-1", "../state/criu-dump.log", "app", reg+"/x:1")
			return err
		}, "outside"},
		"missing archive": {func() error {
			_, err := c.BuildCheckpointImage(ctx, "node-1", "nope.tar", "app", reg+"/x:1")
			return err
		}, "no such file"},
		"no container": {func() error {
			_, err := c.BuildCheckpointImage(ctx, "node-1", archive, "", reg+"/x:1")
			return err
		}, "container: empty"},
		"bad ref": {func() error {
			_, err := c.BuildCheckpointImage(ctx, "node-1", archive, "app", "UPPER CASE")
			return err
		}, "not an image tag"},
		"unknown node":      {func() error { return c.PullImage(ctx, "node-9", "a/b:c", nil) }, "no such node"},
		"pull fails":        {func() error { return c.PullImage(ctx, "node-1", "reg/missing:1", nil) }, "not found in the registry"},
		"log not a .log":    {func() error { _, err := c.ReadLog(ctx, "node-1", "/etc/passwd"); return err }, "only .log files"},
		"log via a symlink": {func() error { _, err := c.ReadLog(ctx, "node-1", "escape.log"); return err }, "outside the log folders"},
		"wrong token": {func() error {
			bad := c
			bad.Token = "nope"
			return bad.PullImage(ctx, "node-1", "a/b:c", nil)
		}, "wrong bearer token"},
	} {
		t.Run(name, func(t *testing.T) {
			err := call.do()
			if err == nil || !strings.Contains(err.Error(), call.want) {
				t.Errorf("error = %v, want one saying %q", err, call.want)
			}
		})
	}
	if len(p.refs) != 0 {
		t.Errorf("pulled %v on bad requests", p.refs)
	}
}

func TestPullAndLogs(t *testing.T) {
	c, _, _, p := setup(t)
	ctx := t.Context()
	if err := c.PullImage(ctx, "node-1", "10.77.0.1:5000/app@sha256:"+strings.Repeat("a", 64), nil); err != nil {
		t.Fatal(err)
	}
	if len(p.refs) != 1 || p.auths[0] != nil {
		t.Errorf("pulled %v with %v", p.refs, p.auths)
	}
	log, err := c.ReadLog(ctx, "node-1", "criu-dump.log")
	if err != nil || !strings.Contains(log, "it broke") {
		t.Errorf("ReadLog = %q, %v", log, err)
	}
}

func TestNewServerNeedsTokenAndFolder(t *testing.T) {
	if _, err := NewServer(Config{Token: "t"}); err == nil || !strings.Contains(err.Error(), "MS2M_AGENT_CHECKPOINT_DIR") {
		t.Errorf("no folder: %v", err)
	}
	if _, err := NewServer(Config{CheckpointDir: "/x"}); err == nil || !strings.Contains(err.Error(), "MS2M_AGENT_TOKEN") {
		t.Errorf("no token: %v", err)
	}

}

// TestFailedPushRemovesTheArchive: a build whose push fails (here to a
// registry that refuses connections) removes the archive, the process's
// memory: no migration builds from one checkpoint twice. A request
// refused before the build (a reference outside the repository) leaves it.
func TestFailedPushRemovesTheArchive(t *testing.T) {
	const reg = "127.0.0.1:1" // nothing listens on port 1
	c, archive, _, _ := setup(t, func(cfg *Config) { cfg.Repository = reg + "/ckpt" })
	ctx := t.Context()
	if _, err := c.BuildCheckpointImage(ctx, "node-1", archive, "app", "elsewhere.test/x/default:m1"); err == nil {
		t.Fatal("a push outside the repository was accepted")
	}
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("a refused request removed the archive: %v", err)
	}
	if _, err := c.BuildCheckpointImage(ctx, "node-1", archive, "app", reg+"/ckpt/default:m1"); err == nil {
		t.Fatal("the push to a registry that refuses connections succeeded")
	}
	if _, err := os.Stat(archive); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the archive is left after the failed push (stat: %v)", err)
	}
}

// TestPullWithThePodsCredentials: the credentials the migrator sends reach
// the runtime's pull as sent, and the agent's log never shows them.
func TestPullWithThePodsCredentials(t *testing.T) {
	var logs bytes.Buffer
	c, _, _, p := setup(t, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	want := &contract.RegistryAuth{Registry: "10.77.0.1:5001", Username: "puller", Password: "s3cret-pass", IdentityToken: "s3cret-id", RegistryToken: "s3cret-bearer"}
	if err := c.PullImage(t.Context(), "node-1", "10.77.0.1:5001/app@sha256:"+strings.Repeat("a", 64), want); err != nil {
		t.Fatal(err)
	}
	if len(p.auths) != 1 || p.auths[0] == nil || *p.auths[0] != *want {
		t.Errorf("the runtime was given %v, want the pod's credentials", p.auths)
	}
	if !strings.Contains(logs.String(), `"withPullSecret":true`) {
		t.Errorf("the pull is not logged as one with a pull secret:\n%s", logs.String())
	}
	for _, s := range []string{"s3cret", "puller"} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the agent logged %q:\n%s", s, logs.String())
		}
	}
}
