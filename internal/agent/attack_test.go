package agent

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/ms2m/ms2m/internal/ociimage"
)

// These tests play a caller that holds the agent's token and wants more
// than ms2m's own work from it: files of the node, pushes of the node's
// archives to a registry of its choosing, deletions of other images.

// logDir is the setup's log folder, next to the checkpoint folder.
func logDir(archive string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(archive)), "state")
}

func TestAgentRefusesLogReadThroughSymlink(t *testing.T) {
	c, archive, _, _ := setup(t)
	ctx := t.Context()
	// A task folder of the runtime holds more than CRIU logs; a link
	// named like a log points at one of those files, inside the folder.
	task := filepath.Join(logDir(archive), "task-1")
	if err := os.MkdirAll(task, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(task, "config.json"), []byte(`{"password":"hunter2"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("config.json", filepath.Join(task, "peek.log")); err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadLog(ctx, "node-1", "task-1/peek.log")
	if err == nil || strings.Contains(got, "hunter2") {
		t.Fatalf("ReadLog through a .log link to config.json = %q, %v: want it refused", got, err)
	}
	if !strings.Contains(err.Error(), "outside the log folders") || !strings.Contains(err.Error(), "only .log files") {
		t.Errorf("error %q: want it to say the real file is not a .log", err)
	}
	// A link from one log to another log of the folder still works.
	if err := os.WriteFile(filepath.Join(task, "dump.log"), []byte("(00.1) Error: real\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("dump.log", filepath.Join(task, "last.log")); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadLog(ctx, "node-1", "task-1/last.log"); err != nil || !strings.Contains(got, "real") {
		t.Errorf("ReadLog of a link to a log = %q, %v", got, err)
	}
}

func TestAgentRefusesArchiveThroughSymlink(t *testing.T) {
	c, archive, reg, _ := setup(t)
	dir := filepath.Dir(filepath.Dir(archive))
	if err := os.WriteFile(filepath.Join(dir, "host-secret"), []byte("root:x:0:0"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(filepath.Dir(archive), "checkpoint-evil.tar")
	if err := os.Symlink(filepath.Join(dir, "host-secret"), link); err != nil {
		t.Fatal(err)
	}
	_, err := c.BuildCheckpointImage(t.Context(), "node-1", link, "app", reg+"/ckpt/evil:1")
	if err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("build from a link to a file outside the checkpoint folder: %v, want it refused", err)
	}
	if _, err := remote.Head(mustRef(t, reg+"/ckpt/evil:1")); err == nil {
		t.Error("the image was pushed all the same")
	}
}

func TestAgentRefusesPushOutsideRepository(t *testing.T) {
	c, archive, reg, _ := setup(t)
	foreign, err := ociimage.ServeRegistry("127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { foreign.Close() })
	for _, ref := range []string{
		foreign.Addr() + "/stolen/app:1", // the caller's own registry
		reg + "/other/app:1",             // the right registry, another repository
		reg + "/ckpt-evil/app:1",         // a name that merely starts like it
		foreign.Addr() + "/ckpt/app:1",   // the repository's path on another registry
	} {
		_, err := c.BuildCheckpointImage(t.Context(), "node-1", archive, "app", ref)
		if err == nil || !strings.Contains(err.Error(), "outside the checkpoint repository") {
			t.Errorf("push to %s: %v, want it refused as outside the checkpoint repository", ref, err)
		}
		if _, err := remote.Head(mustRef(t, ref)); err == nil {
			t.Errorf("%s was pushed all the same", ref)
		}
	}
	if _, err := os.Stat(archive); err != nil {
		t.Errorf("a refused push removed the archive: %v", err)
	}
	// Its namespace's repository under the repository is allowed.
	if _, err := c.BuildCheckpointImage(t.Context(), "node-1", archive, "app", reg+"/ckpt/default:1"); err != nil {
		t.Errorf("push to the namespace's repository: %v", err)
	}
}

// TestAgentRefusesPushToAnotherNamespace: a checkpoint of a pod of
// namespace default (the kubelet's archive name says so) goes to
// <repository>/default only: filed under shop's repository, or at the
// repository's root, or deeper, shop's tenants could pull default's
// memory. On 58fa1c0 every reference was pushed.
func TestAgentRefusesPushToAnotherNamespace(t *testing.T) {
	c, archive, reg, _ := setup(t)
	for _, ref := range []string{
		reg + "/ckpt/shop:1",           // another namespace's repository
		reg + "/ckpt:1",                // the shared root
		reg + "/ckpt/default/deeper:1", // below the namespace's
		reg + "/ckpt/defaults:1",       // a name that merely starts like it
	} {
		_, err := c.BuildCheckpointImage(t.Context(), "node-1", archive, "app", ref)
		if err == nil || !strings.Contains(err.Error(), "namespace default, whose checkpoints go to "+reg+"/ckpt/default only") {
			t.Errorf("push to %s: %v, want it refused for another namespace's repository", ref, err)
		}
		if _, err := remote.Head(mustRef(t, ref)); err == nil {
			t.Errorf("%s was pushed all the same", ref)
		}
	}
	// An archive that does not record its pod is pushed nowhere, nor one
	// whose name is not the kubelet's for the pod it records.
	odd := filepath.Join(filepath.Dir(archive), "checkpoint-odd.tar")
	writeTar(t, odd, map[string]string{"checkpoint/pages-1.img": "criu"})
	if _, err := c.BuildCheckpointImage(t.Context(), "node-1", odd, "app", reg+"/ckpt/default:2"); err == nil || !strings.Contains(err.Error(), "namespace is unknown") {
		t.Errorf("push of %s: %v, want it refused", odd, err)
	}
	renamed := filepath.Join(filepath.Dir(archive), "checkpoint-app_shop-app-2026.tar")
	writeArchive(t, renamed, Origin{Namespace: "default", Pod: "app", Container: "app"})
	if _, err := c.BuildCheckpointImage(t.Context(), "node-1", renamed, "app", reg+"/ckpt/shop:3"); err == nil || !strings.Contains(err.Error(), "not named as the kubelet names one") {
		t.Errorf("push of %s: %v, want it refused", renamed, err)
	}
}

// TestAgentPushCheckNotFooledByHyphens: the kubelet names an archive
// checkpoint-<pod>_<namespace>-<container>-<time>.tar, so namespace a with
// container b-c and namespace a-b with container c give the same name. On
// 7fe2321 the agent split the name at the container the caller named: the
// caller chose the namespace, and could file a's memory under a-b's
// repository (where a-b's tenants may pull). Now the namespace is the one
// the runtime recorded in the archive, whatever the caller names.
func TestAgentPushCheckNotFooledByHyphens(t *testing.T) {
	c, archive, reg, _ := setup(t)
	dir := filepath.Dir(archive)
	const base = "checkpoint-p_a-b-c-2026-01-02T15:04:05Z.tar"
	for _, tc := range []struct {
		origin  Origin
		refused []struct{ container, repo string }
		ok      struct{ container, repo string }
	}{
		{Origin{Namespace: "a", Pod: "p", Container: "b-c"},
			[]struct{ container, repo string }{{"c", "a-b"}, {"b-c", "a-b"}, {"c", "a"}},
			struct{ container, repo string }{"b-c", "a"}},
		{Origin{Namespace: "a-b", Pod: "p", Container: "c"},
			[]struct{ container, repo string }{{"b-c", "a"}, {"c", "a"}, {"b-c", "a-b"}},
			struct{ container, repo string }{"c", "a-b"}},
	} {
		sub := filepath.Join(dir, tc.origin.Namespace)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(sub, base)
		writeArchive(t, path, tc.origin)
		for i, r := range tc.refused {
			ref := fmt.Sprintf("%s/ckpt/%s:x%d", reg, r.repo, i)
			if _, err := c.BuildCheckpointImage(t.Context(), "node-1", path, r.container, ref); err == nil {
				t.Errorf("archive of %+v pushed as container %s to %s; want it refused", tc.origin, r.container, ref)
			} else if !strings.Contains(err.Error(), "container "+tc.origin.Container) && !strings.Contains(err.Error(), "namespace "+tc.origin.Namespace+",") {
				t.Errorf("archive of %+v as container %s to %s: %v; want it to say what the archive is", tc.origin, r.container, ref, err)
			}
			if _, err := remote.Head(mustRef(t, ref)); err == nil {
				t.Errorf("%s was pushed all the same", ref)
			}
		}
		ref := fmt.Sprintf("%s/ckpt/%s:own", reg, tc.ok.repo)
		if _, err := c.BuildCheckpointImage(t.Context(), "node-1", path, tc.ok.container, ref); err != nil {
			t.Errorf("archive of %+v to its own namespace's repository %s: %v", tc.origin, ref, err)
		}
	}
}

func TestArchiveOrigin(t *testing.T) {
	dir := t.TempDir()
	read := func(name string, files map[string]string) (Origin, error) {
		p := filepath.Join(dir, name)
		writeTar(t, p, files)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return ArchiveOrigin(f)
	}
	status := `{"metadata":{"name":"app"},"labels":{"io.kubernetes.pod.namespace":"shop","io.kubernetes.pod.name":"orders-0","io.kubernetes.container.name":"app"}}`
	crio := `{"ociVersion":"1.2.0","annotations":{"io.kubernetes.pod.namespace":"shop","io.kubernetes.pod.name":"orders-0","io.kubernetes.container.name":"app"}}`
	want := Origin{Namespace: "shop", Pod: "orders-0", Container: "app"}
	for name, files := range map[string]map[string]string{
		"containerd": {"checkpoint/pages-1.img": "memory", "spec.dump": `{"ociVersion":"1.2.0","annotations":{"io.kubernetes.cri.container-name":"x"}}`, "status.dump": status},
		"cri-o":      {"spec.dump": crio, "checkpoint/pages-1.img": "memory"},
		"both":       {"spec.dump": crio, "status.dump": status},
	} {
		if got, err := read(name, files); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}
	for name, files := range map[string]map[string]string{
		"no metadata":     {"checkpoint/pages-1.img": "memory"},
		"disagree":        {"spec.dump": strings.Replace(crio, `"shop"`, `"other"`, 1), "status.dump": status},
		"bad namespace":   {"status.dump": strings.Replace(status, `"shop"`, `"Shop_1"`, 1)},
		"empty container": {"status.dump": strings.Replace(status, `"io.kubernetes.container.name":"app"`, `"io.kubernetes.container.name":""`, 1)},
		"bad json":        {"status.dump": "{"},
	} {
		if got, err := read(name, files); err == nil {
			t.Errorf("%s: %+v, want an error", name, got)
		}
	}
	p := filepath.Join(dir, "raw")
	if err := os.WriteFile(p, []byte("criu images, not a tar"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	defer f.Close()
	if _, err := ArchiveOrigin(f); err == nil {
		t.Error("a file that is not a tar: no error")
	}
}

// writeArchive writes a checkpoint archive of o as containerd does: CRIU's
// images and the CRI status with the kubelet's labels.
func writeArchive(t *testing.T, path string, o Origin) {
	t.Helper()
	status, err := json.Marshal(map[string]any{"metadata": map[string]string{"name": o.Container}, "labels": map[string]string{
		labelPodNamespace: o.Namespace, labelPodName: o.Pod, labelContainer: o.Container}})
	if err != nil {
		t.Fatal(err)
	}
	writeTar(t, path, map[string]string{"checkpoint/pages-1.img": strings.Repeat("criu images\n", 1000), "status.dump": string(status)})
}

func writeTar(t *testing.T, path string, files map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o600, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAgentRefusesDeleteOutsideRepository(t *testing.T) {
	c, archive, reg, _ := setup(t)
	ctx := t.Context()
	// Someone else's image, in the same registry, that the agent's push
	// credentials reach.
	victim := mustRef(t, reg+"/team-b/app:1")
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(victim, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	for _, ref := range []string{victim.String(), victim.Context().Digest(d.String()).String()} {
		err := c.DeleteCheckpointImage(ctx, "node-1", ref)
		if err == nil || !strings.Contains(err.Error(), "outside the checkpoint repository") {
			t.Errorf("delete %s: %v, want it refused", ref, err)
		}
	}
	if _, err := remote.Head(victim); err != nil {
		t.Errorf("the other team's image is gone: %v", err)
	}
	// Its own checkpoint images it still deletes.
	own, err := c.BuildCheckpointImage(ctx, "node-1", archive, "app", reg+"/ckpt/default:m1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteCheckpointImage(ctx, "node-1", own); err != nil {
		t.Fatalf("delete its own image: %v", err)
	}
	if _, err := remote.Head(mustRef(t, own)); err == nil {
		t.Errorf("%s is still there after its delete", own)
	}
}

func TestArchiveRemovedAfterPush(t *testing.T) {
	c, archive, reg, _ := setup(t)
	if _, err := c.BuildCheckpointImage(t.Context(), "node-1", archive, "app", reg+"/ckpt/default:m1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(archive); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("archive after the push: %v, want it removed", err)
	}

	keep, archive, reg, _ := setup(t, func(c *Config) { c.KeepArchives = true })
	if _, err := keep.BuildCheckpointImage(t.Context(), "node-1", archive, "app", reg+"/ckpt/default:m1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(archive); err != nil {
		t.Errorf("with KeepArchives, the archive after the push: %v, want it kept", err)
	}
}

func TestNoRepositoryPushesNothing(t *testing.T) {
	c, archive, reg, _ := setup(t, func(c *Config) { c.Repository = "" })
	_, err := c.BuildCheckpointImage(t.Context(), "node-1", archive, "app", reg+"/ckpt/default:m1")
	if err == nil || !strings.Contains(err.Error(), "MS2M_AGENT_IMAGE_REPO") {
		t.Errorf("push with no repository configured: %v, want it refused naming MS2M_AGENT_IMAGE_REPO", err)
	}
	if _, err := NewServer(Config{CheckpointDir: "/x", Token: "t", Repository: "Not A Repo"}); err == nil || !strings.Contains(err.Error(), "MS2M_AGENT_IMAGE_REPO") {
		t.Errorf("a bad repository: %v", err)
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
