package pullsecret

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ms2m/ms2m/internal/contract"
)

const digest = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func dockerConfig(ns, name, auths string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{` + auths + `}}`)}}
}

func basic(user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
}

func TestMatch(t *testing.T) {
	for name, tc := range map[string]struct {
		secrets []*corev1.Secret
		image   string
		want    *contract.RegistryAuth
		wantErr string
	}{
		"host and port": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"10.0.0.1:5001":{"username":"u","password":"p"}`)},
			image:   "10.0.0.1:5001/team/app" + digest,
			want:    &contract.RegistryAuth{Registry: "10.0.0.1:5001", Username: "u", Password: "p"},
		},
		"auth decoded": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", fmt.Sprintf(`"reg.example:443":{"auth":%q}`, basic("u", "p:with:colons")))},
			image:   "reg.example:443/app:1",
			want:    &contract.RegistryAuth{Registry: "reg.example:443", Username: "u", Password: "p:with:colons"},
		},
		"scheme and v1 path, docker hub": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"https://index.docker.io/v1/":{"username":"u","password":"p"}`)},
			image:   "library/app:1",
			want:    &contract.RegistryAuth{Registry: "index.docker.io", Username: "u", Password: "p"},
		},
		"another port does not match": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"10.0.0.1:5000":{"username":"u","password":"p"}`)},
			image:   "10.0.0.1:5001/app" + digest,
		},
		"another host does not match": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"reg.example":{"username":"u","password":"p"}`)},
			image:   "reg.example.evil/app:1",
		},
		"wildcard is one label": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"*.example":{"username":"u","password":"p"}`)},
			image:   "a.b.example/app:1",
		},
		"wildcard label": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"*.example":{"username":"u","password":"p"}`)},
			image:   "reg.example/app:1",
			want:    &contract.RegistryAuth{Registry: "reg.example", Username: "u", Password: "p"},
		},
		"the longest path prefix wins": {
			secrets: []*corev1.Secret{
				dockerConfig("a", "s1", `"reg.example":{"username":"all","password":"p"}`),
				dockerConfig("a", "s2", `"reg.example/team":{"username":"team","password":"p"},"reg.example/te":{"username":"no","password":"p"}`),
			},
			image: "reg.example/team/app:1",
			want:  &contract.RegistryAuth{Registry: "reg.example", Username: "team", Password: "p"},
		},
		"on a tie the first Secret wins": {
			secrets: []*corev1.Secret{
				dockerConfig("a", "s1", `"reg.example":{"username":"first","password":"p"}`),
				dockerConfig("a", "s2", `"reg.example":{"username":"second","password":"p"}`),
			},
			image: "reg.example/app:1",
			want:  &contract.RegistryAuth{Registry: "reg.example", Username: "first", Password: "p"},
		},
		"legacy dockercfg": {
			secrets: []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "s"}, Type: corev1.SecretTypeDockercfg,
				Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"reg.example":{"username":"u","password":"p"}}`)}}},
			image: "reg.example/app:1",
			want:  &contract.RegistryAuth{Registry: "reg.example", Username: "u", Password: "p"},
		},
		"another type is passed over": {
			secrets: []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "s"}, Type: corev1.SecretTypeOpaque,
				Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"reg.example":{"username":"u","password":"p"}}}`)}}},
			image: "reg.example/app:1",
		},
		"not JSON, the content not quoted": {
			secrets: []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "s"}, Type: corev1.SecretTypeDockerConfigJson,
				Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`hunter2-not-json`)}}},
			image:   "reg.example/app:1",
			wantErr: "secret a/s: .dockerconfigjson is not a docker config.json",
		},
		"bad auth, not quoted": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"reg.example":{"auth":"hunter2!!"}`)},
			image:   "reg.example/app:1",
			wantErr: "auth is not base64",
		},
		"an entry without credentials": {
			secrets: []*corev1.Secret{dockerConfig("a", "s", `"reg.example":{"email":"x@y"}`)},
			image:   "reg.example/app:1",
			wantErr: "no credentials in it",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Match(tc.secrets, tc.image)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "hunter2") {
					t.Errorf("the error quotes the Secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// TestForPodReadsOnlyTheNamedSecrets: the Secrets the pod names, in its
// namespace, and no other; a missing one is passed over.
func TestForPodReadsOnlyTheNamedSecrets(t *testing.T) {
	cs := fake.NewSimpleClientset(
		dockerConfig("team", "pull", `"reg.example":{"username":"u","password":"p"}`),
		dockerConfig("team", "other", `"reg.example":{"username":"not-named","password":"p"}`),
		dockerConfig("elsewhere", "pull", `"reg.example":{"username":"other-namespace","password":"p"}`),
	)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "app"},
		Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "gone"}, {Name: "pull"}, {Name: "pull"}}}}
	got, unreadable, err := ForPod(t.Context(), cs, pod, "reg.example/app:1")
	if err != nil || len(unreadable) != 0 {
		t.Fatal(err, unreadable)
	}
	if diff := cmp.Diff(&contract.RegistryAuth{Registry: "reg.example", Username: "u", Password: "p"}, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	var reads []string
	for _, a := range cs.Actions() {
		g, ok := a.(k8stesting.GetAction)
		if !ok || a.GetResource().Resource != "secrets" {
			t.Errorf("ForPod did %s on %s", a.GetVerb(), a.GetResource().Resource)
			continue
		}
		reads = append(reads, g.GetNamespace()+"/"+g.GetName())
	}
	if diff := cmp.Diff([]string{"team/gone", "team/pull"}, reads); diff != "" {
		t.Errorf("Secrets read (-want +got)\n%s", diff)
	}
}

// TestRegistryAuthNeverPrints: however it is printed or logged, the
// credentials stay out.
func TestRegistryAuthNeverPrints(t *testing.T) {
	a := contract.RegistryAuth{Registry: "reg.example", Username: "u-secret", Password: "p-secret", IdentityToken: "i-secret", RegistryToken: "r-secret"}
	for _, s := range []string{fmt.Sprint(a), fmt.Sprint(&a), fmt.Sprintf("%v %+v %#v %s", a, a, a, &a), a.LogValue().String()} {
		if strings.Contains(s, "secret") {
			t.Errorf("printed %q", s)
		}
	}
}

// TestForPodPassesOverAForbiddenSecret: a Secret the migrator may not read
// is passed over and named, the next one still serves.
func TestForPodPassesOverAForbiddenSecret(t *testing.T) {
	cs := fake.NewSimpleClientset(
		dockerConfig("team", "locked", `"reg.example":{"username":"x","password":"x"}`),
		dockerConfig("team", "pull", `"reg.example":{"username":"u","password":"p"}`),
	)
	cs.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == "locked" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "locked", errors.New("RBAC"))
		}
		return false, nil, nil
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "app"},
		Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "locked"}, {Name: "pull"}}}}
	got, unreadable, err := ForPod(t.Context(), cs, pod, "reg.example/app:1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"team/locked"}, unreadable); diff != "" {
		t.Errorf("unreadable (-want +got)\n%s", diff)
	}
	if got == nil || got.Username != "u" {
		t.Errorf("got %v, want the readable Secret's", got)
	}
}
