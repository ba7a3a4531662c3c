package ociimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// FilesOptions describes an image made of files copied from the host.
type FilesOptions struct {
	// Paths are absolute host paths of files, directories and symlinks.
	// Each lands at the same path in the image, a directory with its whole
	// tree. A symlink in the directories leading to a path (the /lib of a
	// merged-/usr system) becomes a symlink in the image too. At least one
	// path is required.
	Paths []string
	// Skip, if set, is asked about every entry found while copying a
	// directory tree, never about Paths themselves. Returning true leaves
	// the entry out, with its subtree. hostPath is the entry's host path.
	Skip func(hostPath string, d fs.DirEntry) bool
	// Files are in-memory files, such as a script. Their parent directories
	// are made with mode 0755 when the host files do not bring them.
	Files []File
	// Entrypoint and Cmd go into the config as they are.
	Entrypoint []string
	Cmd        []string
	// User defaults to NonRootUser.
	User string
	// Env is added to the config. DefaultPath is added unless Env has a PATH.
	Env []string
	// WorkingDir defaults to "/".
	WorkingDir string
	// Labels go into the image config.
	Labels map[string]string
	// Created is the config's and the layer's timestamp. Zero means the
	// Unix epoch, so that the same files give the same digest.
	Created time.Time
}

// File is an in-memory file of a Files image.
type File struct {
	// Path is the absolute path in the image.
	Path string
	// Mode is the permission bits; zero means 0644.
	Mode fs.FileMode
	Data []byte
}

// Files builds a linux/amd64 image with one layer that holds host files:
// each of opts.Paths with its mode, plus the /etc/passwd, /etc/group (user
// 65532 "nonroot") and /tmp of an App image and opts.Files. A symlink stays
// a symlink when what it points to is in the image; otherwise the file it
// resolves to is copied in its place, and a symlink to a directory outside
// the image is an error. Hard links are copied as separate files; devices,
// sockets and pipes are errors. The layer is deterministic: sorted entries,
// the time opts.Created on every entry, and owner 0:0 for all but /tmp.
// Host files are read once, while Files runs.
func Files(opts FilesOptions) (v1.Image, error) {
	if len(opts.Paths) == 0 {
		return nil, errors.New("files image: no paths given; pass at least one host file or directory")
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	user := opts.User
	if user == "" {
		user = NonRootUser
	}
	uid, gid, err := parseNumericUser(user)
	if err != nil {
		return nil, fmt.Errorf("files image: %w", err)
	}
	entries, err := filesEntries(opts, uid, gid)
	if err != nil {
		return nil, fmt.Errorf("files image: %w", err)
	}
	layerTar, err := writeLayerTar(entries, created)
	if err != nil {
		return nil, fmt.Errorf("files image: write layer: %w", err)
	}
	layer, err := layerFromTar(layerTar, true)
	if err != nil {
		return nil, fmt.Errorf("files image: compress layer: %w", err)
	}
	workDir := opts.WorkingDir
	if workDir == "" {
		workDir = "/"
	}
	cfg := v1.Config{
		Entrypoint: slices.Clone(opts.Entrypoint),
		Cmd:        slices.Clone(opts.Cmd),
		User:       user,
		Env:        withPath(opts.Env),
		WorkingDir: workDir,
		Labels:     copyMap(opts.Labels),
	}
	createdBy := fmt.Sprintf("ociimage.Files: %d host paths, %d in-memory files", len(opts.Paths), len(opts.Files))
	return assemble(layer, "amd64", cfg, created, createdBy, nil)
}

// filesEntries computes the layer entries of a Files image.
func filesEntries(opts FilesOptions, tmpUID, tmpGID int) ([]layerEntry, error) {
	t := &fileTree{nodes: map[string]*treeNode{}, skip: opts.Skip}
	for _, e := range baseEntries(tmpUID, tmpGID) {
		t.nodes["/"+strings.TrimSuffix(e.hdr.Name, "/")] = &treeNode{entry: e, base: true}
	}
	for _, p := range opts.Paths {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("path %q is not absolute; give host paths from /", p)
		}
		if err := t.addPath(filepath.Clean(p)); err != nil {
			return nil, err
		}
	}
	t.addParents()
	for _, f := range opts.Files {
		if err := t.addMemFile(f); err != nil {
			return nil, err
		}
	}
	if err := t.settleSymlinks(); err != nil {
		return nil, err
	}
	t.addParents() // of the symlinks that settling crossed
	out := make([]layerEntry, 0, len(t.nodes))
	for _, n := range t.nodes {
		out = append(out, n.entry)
	}
	return out, nil
}

// maxSymlinkHops bounds how many symlinks one lookup follows, as Linux's
// 40 does.
const maxSymlinkHops = 40

// fileTree is the root filesystem of a Files image while it is gathered.
// Nodes are keyed by their absolute image path. A directory always sits at
// its own host path, so an image path without a symlink in it is also the
// host path of what it names.
type fileTree struct {
	nodes map[string]*treeNode
	skip  func(string, fs.DirEntry) bool
}

type treeNode struct {
	entry layerEntry
	// host is the host path the node was copied from; "" for in-memory
	// files and for made-up parent directories.
	host string
	// base marks the /etc and /tmp entries every image has.
	base bool
	// pending marks a symlink found as a path or in a tree, not yet kept or
	// resolved: that waits until the whole tree is known.
	pending bool
}

// put adds a node at image path p. The same host node twice is fine, as
// is a directory twice (the first one's mode wins); anything else at a
// taken path is an error.
func (t *fileTree) put(p string, n *treeNode) error {
	old, ok := t.nodes[p]
	if !ok {
		t.nodes[p] = n
		return nil
	}
	oh, nh := old.entry.hdr, n.entry.hdr
	switch {
	case oh.Typeflag == tar.TypeDir && nh.Typeflag == tar.TypeDir:
		return nil
	case old.base:
		return fmt.Errorf("%s from %s would replace the image's own %s; leave it out", p, describe(n), p)
	case old.host != "" && old.host == n.host && oh.Typeflag == nh.Typeflag:
		return nil
	}
	return fmt.Errorf("%s would hold both %s and %s", p, describe(old), describe(n))
}

func describe(n *treeNode) string {
	if n.host == "" {
		return "an in-memory file"
	}
	return "host " + n.host
}

func imageName(p string) string {
	return strings.TrimPrefix(p, "/")
}

// addPath adds host path p (absolute, clean) at the same image path.
func (t *fileTree) addPath(p string) error {
	hops := 0
	dir, err := t.realDir(filepath.Dir(p), &hops, true)
	if err != nil {
		return fmt.Errorf("path %s: %w", p, err)
	}
	real := filepath.Join(dir, filepath.Base(p))
	return t.addHost(real, real)
}

// realDir returns the host path of directory dir with every symlink in it
// resolved. With record set, each symlink it crosses becomes a symlink node:
// what it points to is a directory that the image will have, since the
// path being added lies under it.
func (t *fileTree) realDir(dir string, hops *int, record bool) (string, error) {
	if dir == "/" {
		return "/", nil
	}
	parent, err := t.realDir(filepath.Dir(dir), hops, record)
	if err != nil {
		return "", err
	}
	p := filepath.Join(parent, filepath.Base(dir))
	fi, err := os.Lstat(p)
	if err != nil {
		return "", err
	}
	if fi.IsDir() {
		return p, nil
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		return "", fmt.Errorf("%s is not a directory", p)
	}
	if *hops++; *hops > maxSymlinkHops {
		return "", fmt.Errorf("too many levels of symbolic links at %s", p)
	}
	link, err := os.Readlink(p)
	if err != nil {
		return "", err
	}
	if record {
		n := &treeNode{host: p, entry: layerEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: imageName(p), Linkname: link, Mode: 0o777}}}
		if err := t.put(p, n); err != nil {
			return "", err
		}
	}
	target := link
	if !filepath.IsAbs(target) {
		target = filepath.Join(parent, target) // parent has no symlinks, so ".." is lexical
	}
	return t.realDir(filepath.Clean(target), hops, record)
}

// addHost copies host path src, whose parent directories are real, to
// image path dst: a file, a symlink (pending) or a directory with its tree.
func (t *fileTree) addHost(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	name := imageName(dst)
	switch m := fi.Mode(); {
	case m.IsRegular():
		return t.put(dst, &treeNode{host: src, entry: layerEntry{source: src, hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: tarMode(m)}}})
	case m&fs.ModeSymlink != 0:
		link, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return t.put(dst, &treeNode{host: src, pending: true, entry: layerEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: link, Mode: 0o777}}})
	case m.IsDir():
		if err := t.put(dst, &treeNode{host: src, entry: dirEntry(name+"/", tarMode(m), 0, 0)}); err != nil {
			return err
		}
		des, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, d := range des {
			child := filepath.Join(src, d.Name())
			if t.skip != nil && t.skip(child, d) {
				continue
			}
			if err := t.addHost(child, path.Join(dst, d.Name())); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%s is a %v, which an image layer cannot hold; skip it", src, m.Type())
	}
}

// addParents adds every missing parent directory of the nodes, with the
// mode of the host directory when it is one, else 0755.
func (t *fileTree) addParents() {
	for _, p := range slices.Sorted(maps.Keys(t.nodes)) {
		for dir := path.Dir(p); dir != "/"; dir = path.Dir(dir) {
			if _, ok := t.nodes[dir]; ok {
				break
			}
			mode := int64(0o755)
			if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
				mode = tarMode(fi.Mode())
			}
			t.nodes[dir] = &treeNode{entry: dirEntry(imageName(dir)+"/", mode, 0, 0)}
		}
	}
}

// addMemFile adds an in-memory file and, with mode 0755, any missing
// parent directory.
func (t *fileTree) addMemFile(f File) error {
	if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
		return fmt.Errorf("in-memory file path %q: want a clean absolute path to a file", f.Path)
	}
	for dir := path.Dir(f.Path); dir != "/"; dir = path.Dir(dir) {
		n, ok := t.nodes[dir]
		if !ok {
			t.nodes[dir] = &treeNode{entry: dirEntry(imageName(dir)+"/", 0o755, 0, 0)}
			continue
		}
		if n.entry.hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("in-memory file %s: %s is not a directory in the image", f.Path, dir)
		}
	}
	mode := f.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	return t.put(f.Path, &treeNode{entry: fileEntry(imageName(f.Path), int64(mode), f.Data)})
}

// settleSymlinks decides every pending symlink. One whose target is in the
// image stays a symlink, and the symlinks its target path crosses join the
// image too. The rest are replaced by the file they resolve to on the
// host. A target counts as in the image when it is a node, including a
// pending symlink, since that will be a symlink or a file either way.
func (t *fileTree) settleSymlinks() error {
	for {
		var pending []string
		for p, n := range t.nodes {
			if n.pending {
				pending = append(pending, p)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		slices.Sort(pending)
		kept := false
		for _, p := range pending {
			ok, err := t.keepSymlink(p)
			if err != nil {
				return err
			}
			kept = kept || ok
		}
		if kept {
			continue // a kept symlink may have made another's target appear
		}
		for _, p := range pending {
			if err := t.resolveSymlink(p); err != nil {
				return err
			}
		}
	}
}

// keepSymlink keeps the pending symlink at image path p if its target is
// in the image.
func (t *fileTree) keepSymlink(p string) (bool, error) {
	n := t.nodes[p]
	target := n.entry.hdr.Linkname
	if !path.IsAbs(target) {
		target = path.Join(path.Dir(p), target)
	}
	target = path.Clean(target)
	hops := 0
	dir, err := t.realDir(path.Dir(target), &hops, false)
	if err != nil {
		return false, nil // dangling or looping on the host: resolving will say
	}
	if _, ok := t.nodes[path.Join(dir, path.Base(target))]; !ok && target != "/" {
		return false, nil
	}
	hops = 0
	if _, err := t.realDir(path.Dir(target), &hops, true); err != nil {
		return false, fmt.Errorf("symlink %s -> %s: %w", p, n.entry.hdr.Linkname, err)
	}
	n.pending = false
	return true, nil
}

// resolveSymlink replaces the pending symlink at image path p by a copy of
// the host file it resolves to.
func (t *fileTree) resolveSymlink(p string) error {
	n := t.nodes[p]
	real, err := filepath.EvalSymlinks(n.host)
	if err != nil {
		return fmt.Errorf("symlink %s -> %s: %w", n.host, n.entry.hdr.Linkname, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("symlink %s points to directory %s, which is not in the image; add %s to the paths", n.host, real, real)
	}
	delete(t.nodes, p)
	if err := t.addHost(real, p); err != nil {
		return fmt.Errorf("symlink %s: %w", n.host, err)
	}
	return nil
}
