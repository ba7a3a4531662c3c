package debianjre

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/ociimage/debianpy"
)

// DefaultHome is Debian's OpenJDK 17.
const DefaultHome = "/usr/lib/jvm/java-17-openjdk-amd64"

// skipLib are native libraries of the runtime that a headless server does
// not load, most of them because they need X11, ALSA or FreeType, which the
// image does not carry.
var skipLib = []string{
	"libatk-wrapper.so", "libawt_xawt.so", "libfontmanager.so", "libjawt.so", "libjavajpeg.so",
	"libjsound.so", "liblcms.so", "libsplashscreen.so",
}

// skipFile are files under lib that the JVM does not read at run time:
// the compiler's symbol table, sources, and the CDS archive for heaps
// above 32 GiB.
var skipFile = []string{"ct.sym", "src.zip", "classes_nocoops.jsa"}

// Options returns the FilesOptions of an image that runs java from home
// (DefaultHome when empty): Paths, Skip and Env are set, and the caller
// adds its program (Files), Entrypoint and Labels. The image keeps the
// runtime at the same path, so Java (the launcher) is home/bin/java.
func Options(home string) (ociimage.FilesOptions, error) {
	if home == "" {
		home = DefaultHome
	}
	java := filepath.Join(home, "bin", "java")
	if _, err := os.Stat(filepath.Join(home, "lib", "modules")); err != nil {
		return ociimage.FilesOptions{}, fmt.Errorf("debian jre: %s is not a Java runtime (%w); install Debian's openjdk-17-jre-headless", home, err)
	}
	if _, err := os.Stat(java); err != nil {
		return ociimage.FilesOptions{}, fmt.Errorf("debian jre: %w", err)
	}
	lib := filepath.Join(home, "lib")
	elfs := []string{java}
	err := filepath.WalkDir(lib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skip(p, d) {
			return nil
		}
		if d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".so") {
			elfs = append(elfs, p)
		}
		return nil
	})
	if err != nil {
		return ociimage.FilesOptions{}, fmt.Errorf("debian jre: %w", err)
	}
	dirs := append([]string{lib, filepath.Join(lib, "server")}, debianpy.LibDirs...)
	libs, err := debianpy.SharedLibs(elfs, dirs)
	if err != nil {
		return ociimage.FilesOptions{}, fmt.Errorf("debian jre: %w", err)
	}
	paths := []string{java, lib, filepath.Join(home, "conf"), filepath.Join(home, "release")}
	for _, l := range libs {
		if !strings.HasPrefix(l, home+string(filepath.Separator)) { // the runtime's own come with lib
			paths = append(paths, l)
		}
	}
	slices.Sort(paths)
	return ociimage.FilesOptions{
		Paths: slices.Compact(paths),
		Skip:  skip,
		Env:   []string{"JAVA_HOME=" + home},
	}, nil
}

// Skip reports whether an entry of the runtime's folders is left out of the
// image. It fits ociimage.FilesOptions.Skip.
func skip(hostPath string, d fs.DirEntry) bool {
	name := d.Name()
	return !d.IsDir() && (slices.Contains(skipLib, name) || slices.Contains(skipFile, name))
}
