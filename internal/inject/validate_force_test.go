package inject

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestMigrateForceAnnotation: the override of migrate-to's placement
// check is a known annotation, "true" or "false", and nothing else.
func TestMigrateForceAnnotation(t *testing.T) {
	for _, tc := range []struct {
		value   string
		wantBad bool
	}{
		{value: "true"},
		{value: "false"},
		{value: "yes", wantBad: true},
		{value: "", wantBad: true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
				contract.AnnotationMigrateTo: "node-b", contract.AnnotationMigrateForce: tc.value,
			}}}
			warnings, err := checkAnnotations(pod)
			if diff := cmp.Diff([]string(nil), warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if got := err != nil; got != tc.wantBad {
				t.Fatalf("checkAnnotations: %v, want denied %v", err, tc.wantBad)
			}
			if err != nil && !strings.Contains(err.Error(), contract.AnnotationMigrateForce) {
				t.Errorf("denial %q does not name %s", err, contract.AnnotationMigrateForce)
			}
		})
	}
}
