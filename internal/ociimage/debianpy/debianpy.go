package debianpy

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ms2m/ms2m/internal/ociimage"
)

const (
	// Interpreter is Debian's python3, the one that python3-* packages
	// install modules for. Entrypoints should name it rather than rely on
	// PATH.
	Interpreter = "/usr/bin/python3"
	// DistPackages is where Debian's python3-* packages put their modules.
	DistPackages = "/usr/lib/python3/dist-packages"
)

// LibDirs are the directories searched for a shared library by name, in
// order: Debian's multiarch directories for x86-64, which the dynamic
// loader searches by default.
var LibDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}

// Env is the environment the image gets: no bytecode writing (the user
// 65532 cannot write to the standard library anyway) and unbuffered
// output, so that logs reach the container runtime at once.
var Env = []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"}

// stdlibSkip are directories directly under the standard library that a
// consumer never imports: tests, GUI, bootstrap and the static library for
// building extensions (config-*, 25 MB).
var stdlibSkip = []string{"ensurepip", "idlelib", "lib2to3", "test", "tkinter", "turtledemo"}

// Options returns the FilesOptions of an image that runs Debian's python3
// with the dist-packages named in packages (directory or module names under
// DistPackages, such as "pika"). Paths, Skip and Env are set; the caller
// adds its program (Files), Entrypoint, User and Labels.
//
// The paths are Interpreter and the file it links to, the standard library
// directory, the packages, and the shared libraries that the interpreter
// and every extension module in the image need (DT_NEEDED, transitively,
// looked up in LibDirs), with the dynamic loader (PT_INTERP). Skip leaves
// out __pycache__ directories, the directories in stdlibSkip, config-*,
// and the test extension modules.
func Options(packages ...string) (ociimage.FilesOptions, error) {
	paths, err := Paths(packages...)
	if err != nil {
		return ociimage.FilesOptions{}, err
	}
	return ociimage.FilesOptions{Paths: paths, Skip: Skip, Env: slices.Clone(Env)}, nil
}

// Paths returns the host paths described at Options, sorted.
func Paths(packages ...string) ([]string, error) {
	exe, err := filepath.EvalSymlinks(Interpreter)
	if err != nil {
		return nil, fmt.Errorf("debian python: %w; install Debian's python3 (apt-get install python3)", err)
	}
	version := filepath.Base(exe) // python3.11
	if !strings.HasPrefix(version, "python3.") {
		return nil, fmt.Errorf("debian python: %s links to %s, not a python3.X binary", Interpreter, exe)
	}
	stdlib := filepath.Join("/usr/lib", version)
	if _, err := os.Stat(filepath.Join(stdlib, "os.py")); err != nil {
		return nil, fmt.Errorf("debian python: standard library of %s: %w", exe, err)
	}
	paths := []string{Interpreter, exe, stdlib}
	for _, name := range packages {
		p, err := distPackage(name)
		if err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}

	elfs := []string{exe}
	for _, root := range paths[2:] {
		found, err := extensionModules(root)
		if err != nil {
			return nil, fmt.Errorf("debian python: %w", err)
		}
		elfs = append(elfs, found...)
	}
	libs, err := sharedLibs(elfs, LibDirs)
	if err != nil {
		return nil, fmt.Errorf("debian python: %w", err)
	}
	paths = append(paths, libs...)
	slices.Sort(paths)
	return slices.Compact(paths), nil
}

// distPackage finds a package directory or a module file in DistPackages.
func distPackage(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "/\\") || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("debian python: package %q: want a top-level name such as pika", name)
	}
	for _, p := range []string{filepath.Join(DistPackages, name), filepath.Join(DistPackages, name+".py")} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("debian python: package %q is not in %s; install it (apt-get install python3-%s)", name, DistPackages, name)
}

// Skip reports whether an entry of the standard library or of a package is
// left out of the image. It fits ociimage.FilesOptions.Skip.
func Skip(hostPath string, d fs.DirEntry) bool {
	name := d.Name()
	if d.IsDir() {
		if name == "__pycache__" {
			return true
		}
		dir, base := filepath.Split(hostPath)
		if strings.HasPrefix(filepath.Base(dir), "python3.") && filepath.Dir(filepath.Clean(dir)) == "/usr/lib" {
			return slices.Contains(stdlibSkip, base) || strings.HasPrefix(base, "config-")
		}
		return false
	}
	if filepath.Base(filepath.Dir(hostPath)) == "lib-dynload" {
		for _, prefix := range []string{"_test", "_ctypes_test", "_xxtestfuzz", "xxlimited"} {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		}
	}
	return false
}

// extensionModules returns the *.so files under root that Skip keeps.
func extensionModules(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root && Skip(p, d) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".so") {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// sharedLibs returns the host paths of what the ELF files load: the
// libraries they name in DT_NEEDED, looked up in dirs, then those
// libraries' own, and the program interpreter of any of them. The paths
// are in the order found, each once.
func sharedLibs(files, dirs []string) ([]string, error) {
	var out []string
	done := map[string]bool{} // DT_NEEDED names and interpreter paths
	queue := slices.Clone(files)
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		needed, interp, err := elfDeps(f)
		if err != nil {
			return nil, err
		}
		if interp != "" && !done[interp] {
			done[interp] = true
			out = append(out, interp)
		}
		for _, name := range needed {
			if done[name] {
				continue
			}
			done[name] = true
			p, err := findLib(name, dirs)
			if err != nil {
				return nil, fmt.Errorf("%s needs %s: %w", f, name, err)
			}
			out = append(out, p)
			queue = append(queue, p)
		}
	}
	return out, nil
}

// elfDeps returns the DT_NEEDED entries and the PT_INTERP path of an
// x86-64 ELF file.
func elfDeps(path string) (needed []string, interp string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("read ELF %s: %w", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		return nil, "", fmt.Errorf("ELF %s is %v %v, want x86-64", path, f.Class, f.Machine)
	}
	needed, err = f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, "", fmt.Errorf("read DT_NEEDED of %s: %w", path, err)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return nil, "", fmt.Errorf("read PT_INTERP of %s: %w", path, err)
		}
		interp = string(bytes.TrimRight(b, "\x00"))
	}
	return needed, interp, nil
}

// findLib looks a DT_NEEDED name up in dirs, in order.
func findLib(name string, dirs []string) (string, error) {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err != nil {
			return "", err
		}
		return name, nil
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s; install the Debian package that ships it", strings.Join(dirs, ", "))
}

// SharedLibs returns the host paths of what the x86-64 ELF files load,
// transitively: the libraries they name in DT_NEEDED, looked up in dirs in
// order, and the program interpreter. Each path comes once, in the order
// found. Other runtimes' images (debianjre) use it too.
func SharedLibs(files, dirs []string) ([]string, error) { return sharedLibs(files, dirs) }
