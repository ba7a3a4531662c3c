package pullsecret

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
)

// maxConfig bounds a Secret's docker config that is parsed; the API server
// caps a Secret at 1 MiB anyway.
const maxConfig = 1 << 20

// ForPod returns the credentials for image from pod's imagePullSecrets,
// or nil when none of them has any for its registry (the node's own
// configuration, or none, then applies, as for the kubelet). It reads
// only the Secrets the pod names, in the pod's namespace. A named Secret
// that is missing, or of another type, is passed over as the kubelet does;
// one the caller may not read (RBAC: the chart grants get only on the
// Secret names it lists) is passed over too, and named in unreadable, so
// that a pull that then fails can say what to grant. One that cannot be
// parsed is an error, without its content.
func ForPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, image string) (auth *contract.RegistryAuth, unreadable []string, err error) {
	var secrets []*corev1.Secret
	seen := map[string]bool{}
	for _, ref := range pod.Spec.ImagePullSecrets {
		if ref.Name == "" || seen[ref.Name] {
			continue
		}
		seen[ref.Name] = true
		s, err := cs.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case apierrors.IsForbidden(err):
			unreadable = append(unreadable, pod.Namespace+"/"+ref.Name)
			continue
		case err != nil:
			return nil, unreadable, fmt.Errorf("read Secret %s/%s, one of pod %s's imagePullSecrets: %w", pod.Namespace, ref.Name, pod.Name, err)
		}
		secrets = append(secrets, s)
	}
	auth, err = Match(secrets, image)
	return auth, unreadable, err
}

// entry is one registry's credentials in a docker config.
type entry struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// Match returns the credentials for image among secrets, taken in order:
// the entry whose key matches image's registry and the longest prefix of
// its repository; on a tie, the first Secret's. Nil when none matches.
// Secrets of another type than kubernetes.io/dockerconfigjson and
// kubernetes.io/dockercfg are passed over.
func Match(secrets []*corev1.Secret, image string) (*contract.RegistryAuth, error) {
	ref, err := name.ParseReference(image, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", image, err)
	}
	registry, repo := ref.Context().RegistryStr(), ref.Context().RepositoryStr()
	var best *contract.RegistryAuth
	bestLen := -1
	for _, s := range secrets {
		entries, err := parse(s)
		if err != nil {
			return nil, err
		}
		for key, e := range entries {
			n, ok := keyMatches(key, registry, repo)
			if !ok || n <= bestLen {
				continue
			}
			a, err := e.auth(registry)
			if err != nil {
				return nil, fmt.Errorf("secret %s/%s, key %q: %w", s.Namespace, s.Name, key, err)
			}
			best, bestLen = a, n
		}
	}
	return best, nil
}

// parse reads s's docker config; nil for a Secret of another type.
func parse(s *corev1.Secret) (map[string]entry, error) {
	var raw []byte
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		raw = s.Data[corev1.DockerConfigJsonKey]
	case corev1.SecretTypeDockercfg:
		raw = s.Data[corev1.DockerConfigKey]
	default:
		return nil, nil
	}
	if len(raw) > maxConfig {
		return nil, fmt.Errorf("secret %s/%s: its docker config is %d bytes, over %d", s.Namespace, s.Name, len(raw), maxConfig)
	}
	if s.Type == corev1.SecretTypeDockercfg {
		var m map[string]entry
		if json.Unmarshal(raw, &m) != nil { // the error would quote the content
			return nil, fmt.Errorf("secret %s/%s: %s is not a docker config (JSON object of registries)", s.Namespace, s.Name, corev1.DockerConfigKey)
		}
		return m, nil
	}
	var c struct {
		Auths map[string]entry `json:"auths"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return nil, fmt.Errorf("secret %s/%s: %s is not a docker config.json", s.Namespace, s.Name, corev1.DockerConfigJsonKey)
	}
	return c.Auths, nil
}

// auth turns e into credentials for registry: username and password, or
// the two decoded from auth (base64 of "username:password").
func (e entry) auth(registry string) (*contract.RegistryAuth, error) {
	a := &contract.RegistryAuth{Registry: registry, Username: e.Username, Password: e.Password, IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken}
	if e.Auth != "" && a.Username == "" && a.Password == "" {
		b, err := base64.StdEncoding.DecodeString(e.Auth)
		if err != nil {
			return nil, errors.New("auth is not base64")
		}
		user, pass, ok := strings.Cut(string(b), ":")
		if !ok {
			return nil, errors.New("auth is not username:password")
		}
		a.Username, a.Password = user, pass
	}
	if a.Username == "" && a.Password == "" && a.IdentityToken == "" && a.RegistryToken == "" {
		return nil, errors.New("no credentials in it")
	}
	return a, nil
}

// keyMatches says whether a docker config key matches registry and
// repository repo as the kubelet matches them: the key's host, with "*"
// standing for one DNS label, equals registry's (ports equal too), and
// its path, if any, is a prefix of repo at a "/" boundary. n is how
// specific the match is (the key's length), to prefer the longest.
func keyMatches(key, registry, repo string) (n int, ok bool) {
	k := key
	if !strings.Contains(k, "://") {
		k = "https://" + k
	}
	u, err := url.Parse(k)
	if err != nil || u.Host == "" {
		return 0, false
	}
	p := strings.Trim(u.Path, "/")
	// Docker Hub's keys name its v1 index: https://index.docker.io/v1/.
	if p == "v1" || p == "v2" {
		p = ""
	}
	if !hostMatches(canonicalHost(u.Host), canonicalHost(registry)) {
		return 0, false
	}
	if p != "" && p != repo && !strings.HasPrefix(repo, p+"/") {
		return 0, false
	}
	return len(u.Host) + len(p), true
}

// canonicalHost names Docker Hub one way.
func canonicalHost(h string) string {
	switch strings.ToLower(h) {
	case "docker.io", "index.docker.io", "registry-1.docker.io":
		return "index.docker.io"
	}
	return strings.ToLower(h)
}

// hostMatches compares host[:port]s label by label, "*" in pattern
// matching one label; the ports must be equal.
func hostMatches(pattern, host string) bool {
	ph, pp := splitPort(pattern)
	hh, hp := splitPort(host)
	if pp != hp {
		return false
	}
	pl, hl := strings.Split(ph, "."), strings.Split(hh, ".")
	if len(pl) != len(hl) {
		return false
	}
	for i := range pl {
		if ok, _ := path.Match(pl[i], hl[i]); !ok {
			return false
		}
	}
	return true
}

func splitPort(h string) (host, port string) {
	if i := strings.LastIndex(h, ":"); i >= 0 && !strings.Contains(h[i:], "]") {
		return h[:i], h[i+1:]
	}
	return h, ""
}
