package migratorcli

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ms2m/ms2m/internal/brokeruser"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/envconfig"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestControllerBrokerUserConfig: the controller reads the broker-user
// settings from MS2M_BROKER_*, and a stream address with credentials in it
// (the shared URI of before) is refused with a message that says why.
func TestControllerBrokerUserConfig(t *testing.T) {
	t.Setenv("MS2M_IMAGE_REPO", "registry.test/ckpt")
	t.Setenv("MS2M_BROKER_MANAGEMENT_URL", "http://broker:15672")
	t.Setenv("MS2M_BROKER_ADMIN_USERNAME", "admin")
	t.Setenv("MS2M_BROKER_ADMIN_PASSWORD", "secret")
	t.Setenv("MS2M_BROKER_STREAM_ADDRESS", "rabbitmq-stream://guest:guest@broker:5552/")
	t.Setenv("MS2M_BROKER_USER_NAMESPACES", "shop,shop-eu")
	cfg, err := envconfig.Parse[ControllerConfig]()
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.BrokerUsers
	if b.ManagementURL != "http://broker:15672" || b.UserPrefix != contract.BrokerUserPrefix || strings.Join(b.Namespaces, " ") != "shop shop-eu" {
		t.Fatalf("config: %+v", b)
	}
	_, err = b.provisioner(nil)
	if err == nil || !strings.Contains(err.Error(), "MS2M_BROKER_STREAM_ADDRESS") || !strings.Contains(err.Error(), "without user and password") {
		t.Errorf("a stream address with credentials: %v", err)
	}
}

// TestBrokerUsersCommand runs `migrator broker-users` as an operator who
// provisions by hand would, against a real kube-apiserver and the real
// management API: ensure twice, rotate, remove.
func TestBrokerUsersCommand(t *testing.T) {
	m := testenv.RequireManagement(t)
	b := testenv.RequireBroker(t)
	cfg := testenv.ControlPlane(t)
	kubeconfig := writeKubeconfig(t, cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.WithoutCancel(t.Context())
	ns := testenv.UniqueName("cli")
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(m.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(b.StreamURI)
	prefix := testenv.UniqueName("ms2m-test") + "."
	mgmt := &brokeruser.Management{URL: m.URL, Username: m.Username, Password: m.Password}
	t.Cleanup(func() { _ = mgmt.DeleteUser(context.WithoutCancel(t.Context()), prefix+ns) })
	run := func(verb string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		code := Main(ctx, []string{"broker-users", verb, "--kubeconfig", kubeconfig, "--management-url", m.URL, "--admin-user", m.Username,
			"--admin-password-file", pwFile, "--stream-address", "rabbitmq-stream://" + u.Host + "/", "--user-prefix", prefix, ns}, &out, &errOut)
		if code != 0 {
			t.Fatalf("migrator broker-users %s: exit %d: %s", verb, code, errOut.String())
		}
		return out.String()
	}
	secretURI := func() string {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data[contract.BrokerUserSecretStreamURI])
	}
	if out := run("ensure"); !strings.Contains(out, "new password") || !strings.Contains(out, `^`+ns+`\.`) {
		t.Errorf("first ensure: %q", out)
	}
	first := secretURI()
	if out := run("ensure"); !strings.Contains(out, "unchanged") || secretURI() != first {
		t.Errorf("second ensure: %q, the Secret changed: %v", out, secretURI() != first)
	}
	if p, err := mgmt.GetPermissions(ctx, "/", prefix+ns); err != nil || p != brokeruser.PermissionsFor(ns) {
		t.Errorf("permissions: %+v %v", p, err)
	}
	if run("rotate"); secretURI() == first {
		t.Error("rotate kept the password")
	}
	run("remove")
	if _, err := mgmt.GetUser(ctx, prefix+ns); !errors.Is(err, brokeruser.ErrNotFound) {
		t.Errorf("user after remove: %v", err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret after remove: %v", err)
	}
}

// writeKubeconfig writes cfg (a client certificate's) as a kubeconfig file.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
