package debianjre

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestOptionsBuildAnImageWithTheRuntime builds the image from this host's
// JRE and checks what it holds: the launcher, the runtime's modules, the
// JVM, the configuration that symlinks point at, the C library and the
// loader, and none of what Skip leaves out.
func TestOptionsBuildAnImageWithTheRuntime(t *testing.T) {
	if _, err := os.Stat(DefaultHome); err != nil {
		testenv.Missing(t, "Debian's OpenJDK 17 in "+DefaultHome, "run `make setup`, which installs openjdk-17-jdk-headless")
	}
	opts, err := Options("")
	if err != nil {
		t.Fatal(err)
	}
	opts.Files = []ociimage.File{{Path: "/app/app.jar", Data: []byte("PK")}}
	opts.Entrypoint = []string{DefaultHome + "/bin/java", "-jar", "/app/app.jar"}
	img, err := ociimage.Files(opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]byte{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[path.Clean("/"+h.Name)] = h.Typeflag
	}
	for _, want := range []string{
		DefaultHome + "/bin/java", DefaultHome + "/lib/modules", DefaultHome + "/lib/server/libjvm.so",
		DefaultHome + "/lib/libjli.so", DefaultHome + "/lib/jvm.cfg", DefaultHome + "/lib/security/cacerts",
		DefaultHome + "/conf/security/java.security", "/app/app.jar",
	} {
		if _, ok := got[want]; !ok {
			t.Errorf("the image lacks %s", want)
		}
	}
	if f := got[DefaultHome+"/conf/security/java.security"]; f != tar.TypeReg {
		t.Errorf("java.security (a symlink out of the runtime) is type %q in the image, want a regular file", f)
	}
	libc, loader := false, false
	for p := range got {
		libc = libc || strings.HasSuffix(p, "/libc.so.6")
		loader = loader || strings.HasSuffix(p, "/ld-linux-x86-64.so.2")
		for _, s := range append(append([]string{}, skipLib...), skipFile...) {
			if path.Base(p) == s {
				t.Errorf("the image holds %s, which it leaves out", p)
			}
		}
	}
	if !libc || !loader {
		t.Errorf("the image lacks libc.so.6 (%v) or the loader ld-linux-x86-64.so.2 (%v)", libc, loader)
	}
}
