package inject

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// A checkpoint image holds a pod's whole memory. A pod that names one in a
// container's image runs that memory, and can read it, without asking the
// webhook for a restore: so no image of a pod may lie in ms2m's checkpoint
// repository (Config.CheckpointRepository, any namespace's path below it,
// any tag or digest), except the one image of the restore the controller
// ordered, signed, for that pod's app container.

// imageName is an image reference as the container runtime reads it: the
// registry (lower case, docker.io for the default, no :443) and the
// repository path (lower case, library/ added for docker.io's one-word
// names), without tag or digest.
type imageName struct{ domain, path string }

// parseImageName splits ref the way the runtime does (distribution's
// reference rules): the first path component is a registry when it holds a
// dot or a colon, is localhost, or has an upper-case letter; else the
// registry is docker.io. Registry names are compared without case (DNS),
// and so are paths (a path in upper case is not a valid reference: the
// runtime refuses it, so matching it too costs nothing).
func parseImageName(ref string) (imageName, bool) {
	s := strings.TrimSpace(ref)
	if i := strings.IndexByte(s, '@'); i >= 0 {
		s = s[:i]
	}
	if i := strings.LastIndexByte(s, ':'); i > strings.LastIndexByte(s, '/') {
		s = s[:i]
	}
	if s == "" {
		return imageName{}, false
	}
	var n imageName
	i := strings.IndexByte(s, '/')
	if i < 0 || (!strings.ContainsAny(s[:i], ".:") && s[:i] != "localhost" && strings.ToLower(s[:i]) == s[:i]) {
		n = imageName{domain: "docker.io", path: s}
	} else {
		n = imageName{domain: s[:i], path: s[i+1:]}
	}
	n.domain = strings.ToLower(n.domain)
	n.domain = strings.TrimSuffix(n.domain, ":443") // https's own port: the same registry
	if n.domain == "index.docker.io" || n.domain == "registry-1.docker.io" {
		n.domain = "docker.io"
	}
	n.path = strings.ToLower(strings.Trim(n.path, "/"))
	if n.domain == "docker.io" && !strings.Contains(n.path, "/") {
		n.path = "library/" + n.path
	}
	if n.path == "" || n.path == "library/" {
		return imageName{}, false
	}
	return n, true
}

// within says whether n lies in repository repo or below it: the same
// registry, and the same path or one under it (a path that merely starts
// like it, repo-evil, is another repository).
func (n imageName) within(repo imageName) bool {
	return n.domain == repo.domain && (n.path == repo.path || strings.HasPrefix(n.path, repo.path+"/"))
}

func (n imageName) String() string { return n.domain + "/" + n.path }

// checkpointRepository is cfg's checkpoint repository, parsed; false when
// none is configured.
func checkpointRepository(cfg Config) (imageName, bool, error) {
	if cfg.CheckpointRepository == "" {
		return imageName{}, false, nil
	}
	s := strings.TrimSuffix(cfg.CheckpointRepository, "/")
	if strings.ContainsAny(s, "@ \t\r\n") || (strings.LastIndexByte(s, ':') > strings.LastIndexByte(s, '/')) {
		return imageName{}, false, fmt.Errorf("checkpointRepository %q: want a repository without tag or digest, e.g. registry.example.com/ms2m/checkpoints", cfg.CheckpointRepository)
	}
	n, ok := parseImageName(s)
	if !ok {
		return imageName{}, false, fmt.Errorf("checkpointRepository %q is not a repository", cfg.CheckpointRepository)
	}
	return n, true, nil
}

// CheckImages denies a pod any of whose images lies in cfg's checkpoint
// repository, with a message that names the container, the image and why;
// nil when none does, or no repository is configured. restore is the
// restore instruction the webhook verified for this pod (nil: none): its
// image is allowed in the app container only. old is the pod before an
// UPDATE (nil for a CREATE): an image a container had already is not
// checked again, since it was admitted then (a restored pod keeps running
// its checkpoint image through every later update).
func CheckImages(pod, old *corev1.Pod, cfg Config, restore *Migration) error {
	repo, ok, err := checkpointRepository(cfg)
	if err != nil || !ok {
		return err
	}
	app := ""
	if restore != nil {
		if a := appContainer(pod); a != nil {
			app = a.Name
		}
	}
	type kind struct {
		what string
		cs   []corev1.Container
		was  map[string]string
	}
	images := func(cs []corev1.Container) map[string]string {
		m := map[string]string{}
		for _, c := range cs {
			m[c.Name] = c.Image
		}
		return m
	}
	ephemeral := func(p *corev1.Pod) []corev1.Container {
		var out []corev1.Container
		for _, e := range p.Spec.EphemeralContainers {
			out = append(out, corev1.Container{Name: e.Name, Image: e.Image})
		}
		return out
	}
	kinds := []kind{
		{what: "container", cs: pod.Spec.Containers},
		{what: "init container", cs: pod.Spec.InitContainers},
		{what: "ephemeral container", cs: ephemeral(pod)},
	}
	if old != nil {
		kinds[0].was = images(old.Spec.Containers)
		kinds[1].was = images(old.Spec.InitContainers)
		kinds[2].was = images(ephemeral(old))
	}
	var bad []string
	for _, k := range kinds {
		for _, c := range k.cs {
			if prev, ok := k.was[c.Name]; ok && prev == c.Image {
				continue
			}
			n, ok := parseImageName(c.Image)
			if !ok || !n.within(repo) {
				continue
			}
			if k.what == "container" && restore != nil && c.Name == app && c.Image == restore.Image {
				continue
			}
			if k.what == "container" && restore != nil && c.Name != app && restore.Images[c.Name] == c.Image {
				continue
			}
			bad = append(bad, fmt.Sprintf("%s %q has image %s", k.what, c.Name, quote(c.Image)))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return denyf("%s, in ms2m's checkpoint repository %s: a checkpoint image holds a pod's whole memory, and only a restore that ms2m's controller ordered (signed) for this pod may run one, in its app container; use the application's own image",
		strings.Join(bad, "; "), repo)
}
