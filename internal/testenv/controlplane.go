package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControlPlane starts a real kube-apiserver and etcd (from
// KUBEBUILDER_ASSETS, else the repository's bin/k8s) for t, stopped when t
// ends, and returns a client configuration with full rights.
func ControlPlane(t testing.TB) *rest.Config {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(ModuleRoot(t), "bin", "k8s")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			Missing(t, "the test control plane's "+b+" in "+dir, "run `make k8s-bin`, or set KUBEBUILDER_ASSETS")
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start the test control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop the test control plane: %v", err)
		}
	})
	return cfg
}
