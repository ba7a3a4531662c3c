package debianpy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/ociimage"
)

// consumerScript is the unmodified example consumer the image must run.
const consumerScript = "../../../examples/consumer-python/consumer.py"

type fakeEntry struct {
	name string
	dir  bool
}

func (e fakeEntry) Name() string { return e.name }
func (e fakeEntry) IsDir() bool  { return e.dir }
func (e fakeEntry) Type() fs.FileMode {
	if e.dir {
		return fs.ModeDir
	}
	return 0
}
func (e fakeEntry) Info() (fs.FileInfo, error) { return nil, fs.ErrNotExist }

func TestSkip(t *testing.T) {
	tests := map[string]struct {
		path string
		dir  bool
		want bool
	}{
		"stdlib test dir":         {path: "/usr/lib/python3.11/test", dir: true, want: true},
		"stdlib tkinter":          {path: "/usr/lib/python3.11/tkinter", dir: true, want: true},
		"stdlib config dir":       {path: "/usr/lib/python3.11/config-3.11-x86_64-linux-gnu", dir: true, want: true},
		"pycache in stdlib":       {path: "/usr/lib/python3.11/__pycache__", dir: true, want: true},
		"pycache in a package":    {path: "/usr/lib/python3/dist-packages/pika/adapters/__pycache__", dir: true, want: true},
		"a test dir deeper down":  {path: "/usr/lib/python3.11/unittest/test", dir: true, want: false},
		"package named test":      {path: "/usr/lib/python3/dist-packages/test", dir: true, want: false},
		"json package":            {path: "/usr/lib/python3.11/json", dir: true, want: false},
		"lib-dynload":             {path: "/usr/lib/python3.11/lib-dynload", dir: true, want: false},
		"hashlib module":          {path: "/usr/lib/python3.11/lib-dynload/_hashlib.cpython-311-x86_64-linux-gnu.so", want: false},
		"test extension":          {path: "/usr/lib/python3.11/lib-dynload/_testcapi.cpython-311-x86_64-linux-gnu.so", want: true},
		"xxlimited extension":     {path: "/usr/lib/python3.11/lib-dynload/xxlimited_35.cpython-311-x86_64-linux-gnu.so", want: true},
		"a file named test":       {path: "/usr/lib/python3.11/test", want: false},
		"stdlib module":           {path: "/usr/lib/python3.11/os.py", want: false},
		"_test module outside":    {path: "/usr/lib/python3/dist-packages/pika/_testing.py", want: false},
		"another python's config": {path: "/usr/lib/python3.12/config-3.12-x86_64-linux-gnu", dir: true, want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Skip(tc.path, fakeEntry{name: filepath.Base(tc.path), dir: tc.dir}); got != tc.want {
				t.Errorf("Skip(%s, dir=%v) = %v, want %v", tc.path, tc.dir, got, tc.want)
			}
		})
	}
}

func TestDistPackageErrors(t *testing.T) {
	tests := map[string]struct{ name, wantErr string }{
		"empty":     {name: "", wantErr: "top-level name"},
		"path":      {name: "pika/adapters", wantErr: "top-level name"},
		"dot-dot":   {name: "..", wantErr: "top-level name"},
		"not there": {name: "no_such_package_ms2m", wantErr: "apt-get install python3-no_such_package_ms2m"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := distPackage(tc.name)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("distPackage(%q) error = %v, want one containing %q", tc.name, err, tc.wantErr)
			}
		})
	}
}

// requireDebianPython skips the test, or fails it in CI, when the host has
// no Debian python3 with pika.
func requireDebianPython(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(DistPackages, "pika")); err != nil {
		unavailable(t, "Debian's python3-pika is not installed (%v); apt-get install -y python3-pika", err)
	}
}

func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s. Run `make test`, which provides the test dependencies.", msg)
	}
	t.Skipf("SKIPPING INTEGRATION TEST: %s. Set CI=true to make this a failure.", msg)
}

// TestPathsOnThisHost checks the file set against the host's Debian
// python3: reading ELF headers of some 50 files, it is fast.
func TestPathsOnThisHost(t *testing.T) {
	requireDebianPython(t)
	paths, err := Paths("pika")
	if err != nil {
		t.Fatal(err)
	}
	exe, err := filepath.EvalSymlinks(Interpreter)
	if err != nil {
		t.Fatal(err)
	}
	stdlib := filepath.Join("/usr/lib", filepath.Base(exe))
	want := []string{
		Interpreter, exe, stdlib, filepath.Join(DistPackages, "pika"),
		"/lib64/ld-linux-x86-64.so.2",                // PT_INTERP of python3.X
		"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", // DT_NEEDED of libc
		"/lib/x86_64-linux-gnu/libc.so.6",            // of python3.X
		"/lib/x86_64-linux-gnu/libz.so.1",            // of python3.X
		"/lib/x86_64-linux-gnu/libexpat.so.1",        // of python3.X
		"/lib/x86_64-linux-gnu/libcrypto.so.3",       // of _hashlib and _ssl
		"/lib/x86_64-linux-gnu/libssl.so.3",          // of _ssl
		"/lib/x86_64-linux-gnu/libgssapi_krb5.so.2",  // of libtirpc, of libnsl, of nis: transitive
		"/lib/x86_64-linux-gnu/libkrb5support.so.0",  // two more levels down
	}
	for _, w := range want {
		if !slices.Contains(paths, w) {
			t.Errorf("Paths lacks %s; got:\n%s", w, strings.Join(paths, "\n"))
		}
	}
	if !slices.IsSorted(paths) || len(slices.Compact(slices.Clone(paths))) != len(paths) {
		t.Errorf("Paths is not sorted and unique:\n%s", strings.Join(paths, "\n"))
	}
	for _, p := range paths {
		if strings.HasPrefix(p, stdlib+"/") || strings.Contains(p, "__pycache__") {
			t.Errorf("Paths has %s, which the stdlib directory or Skip already covers", p)
		}
	}

	// The extension modules scanned are the ones the image holds.
	mods, err := extensionModules(stdlib)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, strings.SplitN(filepath.Base(m), ".", 2)[0])
	}
	for _, w := range []string{"_hashlib", "_ssl", "_json", "_uuid"} {
		if !slices.Contains(names, w) {
			t.Errorf("extension modules lack %s: %v", w, names)
		}
	}
	if slices.Contains(names, "_testcapi") {
		t.Errorf("extension modules include the skipped _testcapi: %v", names)
	}
}

func TestSharedLibsErrors(t *testing.T) {
	requireDebianPython(t)
	exe, _ := filepath.EvalSymlinks(Interpreter)
	if _, err := sharedLibs([]string{exe}, []string{t.TempDir()}); err == nil || !strings.Contains(err.Error(), "needs libm.so.6") {
		t.Errorf("sharedLibs with an empty lib dir: error = %v, want one naming libm.so.6", err)
	}
	text := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(text, []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sharedLibs([]string{text}, LibDirs); err == nil || !strings.Contains(err.Error(), "read ELF") {
		t.Errorf("sharedLibs of a text file: error = %v, want a read ELF error", err)
	}
}

// TestImageRunsPikaAndTheConsumer builds the consumer-python image from
// the host's files, unpacks its layer, and runs python in it with chroot
// as the image's user: first the imports, then the unmodified consumer
// against the real broker, checking that it folds a published message.
func TestImageRunsPikaAndTheConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: builds a 15 MB image and runs it; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	requireDebianPython(t)

	start := time.Now()
	img := buildConsumerImage(t)
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v; want 1", len(layers), err)
	}
	size, _ := layers[0].Size()
	t.Logf("image built in %v, layer %.1f MiB compressed", time.Since(start).Round(time.Millisecond), float64(size)/(1<<20))

	root := filepath.Join(t.TempDir(), "rootfs")
	unpack(t, img, root)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	chroot := func(ctx context.Context, env []string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{"--userspec=" + cf.Config.User, root}, args...)...)
		cmd.Env = append(slices.Clone(cf.Config.Env), env...)
		cmd.Dir = "/"
		return cmd
	}

	ctx := t.Context()
	out, err := chroot(ctx, nil, Interpreter, "-c", "import pika, hashlib, json, http.server, socket, ssl, sys; print(sys.executable, pika.__version__, hashlib.sha256(b'').hexdigest()[:8])").CombinedOutput()
	if err != nil {
		t.Fatalf("import in the image: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), Interpreter+" "; !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "e3b0c442") {
		t.Errorf("import in the image printed %q, want %q, pika's version and sha256's e3b0c442", got, want)
	}

	url := "amqp://guest:guest@127.0.0.1:5672/"
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		unavailable(t, "RabbitMQ is unreachable at %s (%v)", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := fmt.Sprintf("ms2m-debianpy-test-%d", time.Now().UnixNano())
	t.Cleanup(func() { ch.QueueDelete(queue, false, false, false) })

	addr := freeAddr(t)
	cons := chroot(ctx, []string{"QUEUE=" + queue, "HTTP_ADDR=" + addr, "AMQP_URL=" + url, "WORK_MS=1", "CONNECTION_NAME=ms2m-debianpy-test"},
		cf.Config.Entrypoint...)
	var logs strings.Builder
	cons.Stdout, cons.Stderr = &logs, &logs
	if err := cons.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cons.Wait() }()
	t.Cleanup(func() {
		if cons.ProcessState == nil {
			cons.Process.Kill()
			t.Logf("consumer killed at cleanup: %v", <-exited)
		}
	})

	waitState(t, addr, exited, &logs, "connected", func(s consumerState) bool { return s.Connected })
	body := []byte("msg-1")
	if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: body, MessageId: "1"}); err != nil {
		t.Fatal(err)
	}
	got := waitState(t, addr, exited, &logs, "count 1", func(s consumerState) bool { return s.Count >= 1 })
	h := sha256.Sum256(append(make([]byte, 32), body...))
	if want := (consumerState{Count: 1, Hash: hex.EncodeToString(h[:]), Last: "msg-1", Connected: true}); got != want {
		t.Errorf("state (-want +got):\n%s", cmp.Diff(want, got))
	}

	// chroot execs the consumer, so the pid is the consumer's.
	if err := cons.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("consumer exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("consumer did not exit within 15s of SIGTERM\n%s", logs.String())
	}
}

func buildConsumerImage(t *testing.T) v1.Image {
	t.Helper()
	script, err := os.ReadFile(consumerScript)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := Options("pika")
	if err != nil {
		t.Fatal(err)
	}
	opts.Files = []ociimage.File{{Path: "/app/consumer.py", Mode: 0o644, Data: script}}
	opts.Entrypoint = []string{Interpreter, "/app/consumer.py"}
	img, err := ociimage.Files(opts)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// unpack extracts the image's layer into dir with tar, keeping modes and
// owners, as a container runtime would.
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("tar", "-x", "-p", "--numeric-owner", "-f", "-", "-C", dir)
		cmd.Stdin = rc
		out, err := cmd.CombinedOutput()
		rc.Close()
		if err != nil {
			t.Fatalf("tar -x: %v\n%s", err, out)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// consumerState is the part of GET /state the test checks.
type consumerState struct {
	Count     int    `json:"count"`
	Hash      string `json:"hash"`
	Last      string `json:"last"`
	Connected bool   `json:"connected"`
}

// waitState polls GET /state until cond holds, the consumer exits or 30
// seconds pass.
func waitState(t *testing.T, addr string, exited <-chan error, logs fmt.Stringer, what string, cond func(consumerState) bool) consumerState {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	var last consumerState
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			t.Fatalf("consumer exited (%v) before %s\n%s", err, what, logs)
		default:
		}
		if resp, err := client.Get("http://" + addr + "/state"); err == nil {
			err = json.NewDecoder(resp.Body).Decode(&last)
			resp.Body.Close()
			if err == nil && cond(last) {
				return last
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("consumer: no %s within 30s; last state %+v\n%s", what, last, logs)
	return last
}
