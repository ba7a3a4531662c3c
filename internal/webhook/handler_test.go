package webhook

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// TestKeepUnknownFields: a pod from an API server newer than this build
// carries fields the Go types drop. The patch must not remove them, and
// must keep the mutation's own removals.
func TestKeepUnknownFields(t *testing.T) {
	raw := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"old":"x"}},` +
		`"spec":{"futureField":{"n":1},"containers":[{"name":"app","image":"app:1","futureKnob":true}]}}`)
	decoded := &corev1.Pod{}
	if err := json.Unmarshal(raw, decoded); err != nil {
		t.Fatal(err)
	}
	mutated := decoded.DeepCopy()
	mutated.Annotations = map[string]string{"new": "y"} // removes "old", adds "new"
	mutated.Spec.Containers[0].Image = "app:2"
	out, err := json.Marshal(mutated)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := keepUnknownFields(admission.PatchResponseFromRaw(raw, out), raw, decoded)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range resp.Patches {
		if op.Operation == "remove" {
			got = append(got, op.Path)
		}
	}
	if diff := cmp.Diff([]string{"/metadata/annotations/old"}, got); diff != "" {
		t.Errorf("removals (-want +got):\n%s", diff)
	}
	if !slices.ContainsFunc(resp.Patches, func(op jsonpatch.JsonPatchOperation) bool {
		return op.Path == "/spec/containers/0/image" && op.Value == "app:2"
	}) {
		t.Errorf("the image change is missing from the patch: %v", resp.Patches)
	}
}
