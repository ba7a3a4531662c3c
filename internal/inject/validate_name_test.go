package inject

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestMigrationNameAnnotation: a migration's name of the form
// migrate.MigrationName gives (<pod>-<time>-<random>, up to 56
// characters), and the older <pod>-<time>, pass; an empty one, one with
// spaces or control characters, and one over 253 characters do not.
func TestMigrationNameAnnotation(t *testing.T) {
	for name, tc := range map[string]struct {
		value   string
		wantBad bool
	}{
		"pod, time and random":     {value: "consumer-5ff94789cb-8t97s-tpnhg0-b7x2k"},
		"cut pod, time and random": {value: strings.Repeat("a", 36) + "-1a2b3c-tpnhg0-b7x2k"},
		"pod and time (older)":     {value: "app-x-tpj70d"},
		"empty":                    {value: "", wantBad: true},
		"a space":                  {value: "consumer-tpnhg0 b7x2k", wantBad: true},
		"a newline":                {value: "consumer-tpnhg0-b7x2k\nms2m.io/restore-node: evil", wantBad: true},
		"a control character":      {value: "consumer-tpnhg0-\x1bb7x2k", wantBad: true},
		"254 characters":           {value: strings.Repeat("m", 254), wantBad: true},
	} {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{contract.AnnotationMigrationName: tc.value}}}
			_, err := checkAnnotations(pod)
			if got := err != nil; got != tc.wantBad {
				t.Fatalf("checkAnnotations: %v, want denied %v", err, tc.wantBad)
			}
			if err != nil && !strings.Contains(err.Error(), contract.AnnotationMigrationName) {
				t.Errorf("denial %q does not name %s", err, contract.AnnotationMigrationName)
			}
		})
	}
}
