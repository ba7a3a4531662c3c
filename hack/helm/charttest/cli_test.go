package charttest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// helmBin is the helm command line that `make helm-bin` builds from this
// module into bin/helm; HELM overrides it.
func helmBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = filepath.Join(repoRoot, "bin", "helm")
	}
	if _, err := os.Stat(bin); err != nil {
		missing(t, "the helm command line at "+bin, "run `make helm-bin` (it builds helm from the pinned Go module into bin/helm), or set HELM")
	}
	return bin
}

// helm runs the helm command line with a private home, so that no user
// configuration or repository cache leaks in.
func helm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func writeValues(t testing.TB, text string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// withBase is the -f arguments for a values file on top of testBase, as
// the SDK renders merge them.
func withBase(t testing.TB, file string) []string {
	t.Helper()
	return []string{"-f", writeValues(t, testBase), "-f", file}
}

func TestHelmLint(t *testing.T) {
	for name, text := range map[string]string{"defaults": "", "cert-manager": certManagerValues, "confined": confinedValues} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", "--kube-version", minKubeVersion, chartDir}, withBase(t, writeValues(t, text))...)...)
			if err != nil {
				t.Fatalf("helm lint --strict: %v\n%s", err, out)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("helm lint says:\n%s", out)
			}
		})
	}
}

// TestHelmTemplate renders with the command line a user runs, and checks
// that it renders the same objects as the SDK.
func TestHelmTemplate(t *testing.T) {
	for name, text := range map[string]string{"defaults": "", "cert-manager": certManagerValues, "confined": confinedValues} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", releaseName, chartDir, "-n", releaseNS, "--kube-version", minKubeVersion}, withBase(t, writeValues(t, text))...)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs, err := parseManifests(out)
			if err != nil {
				t.Fatal(err)
			}
			cli := rendered{objs: objs}
			sdk := render(t, values(t, text))
			if got, want := strings.Join(cli.names(), "\n"), strings.Join(sdk.names(), "\n"); got != want {
				t.Errorf("helm template rendered\n%s\nthe SDK\n%s", got, want)
			}
		})
	}
}

func TestHelmTemplateRefusesBadValues(t *testing.T) {
	for _, bv := range readBadValues(t) {
		t.Run(bv.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", releaseName, chartDir, "-n", releaseNS, "--kube-version", minKubeVersion}, withBase(t, bv.path)...)...)
			checkRefusal(t, out, err, bv.want)
		})
	}
}
