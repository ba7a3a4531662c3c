package controller

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestSignedByUs: the controller trusts a status only with its own
// signature over that namespace and exactly that JSON; a forged, altered,
// moved (to another namespace) or unsigned (written before signing) one is
// not trusted.
func TestSignedByUs(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	raw := Status{Name: "consumer-x-tpj000", Phase: contract.PhaseRunning, Target: "node-b", TargetPod: "consumer-y"}.encode()
	pod := func(ns, status, sig string) *corev1.Pod {
		a := map[string]string{contract.AnnotationMigrationStatus: status}
		if sig != "" {
			a[contract.AnnotationMigrationStatusSignature] = sig
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "consumer-z", Annotations: a}}
	}
	good := statusSignature(key, "shop", raw)
	other := Status{Name: "victim-tpj000", Phase: contract.PhaseRunning}.encode()
	got := map[string]bool{
		"signed":                    signedByUs(key, pod("shop", raw, good)),
		"unsigned (before signing)": signedByUs(key, pod("shop", raw, "")),
		"forged signature":          signedByUs(key, pod("shop", raw, "forged")),
		"another status":            signedByUs(key, pod("shop", other, good)),
		"another namespace":         signedByUs(key, pod("bank", raw, good)),
		"another key":               signedByUs([]byte("another key, just as long........"), pod("shop", raw, good)),
	}
	want := map[string]bool{"signed": true, "unsigned (before signing)": false, "forged signature": false, "another status": false, "another namespace": false, "another key": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trusted (-want +got):\n%s", diff)
	}
}

// The status patch is a merge patch built from types, whatever the status
// holds: starting a migration is guarded by the pod's resourceVersion, and
// an ended one removes the request and its override.
func TestStatusPatch(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop", ResourceVersion: "42"}}
	key := []byte("k")
	for name, tc := range map[string]struct {
		phase   contract.Phase
		wantRV  string
		removed bool
	}{
		"running": {phase: contract.PhaseRunning, wantRV: "42"},
		"failed":  {phase: contract.PhaseFailed, removed: true},
	} {
		t.Run(name, func(t *testing.T) {
			st := Status{Name: `m"1\`, Phase: tc.phase, Message: "quotes \" and \\ and \u2028 survive"}
			b, err := statusPatch(pod, st, key)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Metadata struct {
					ResourceVersion string             `json:"resourceVersion"`
					Annotations     map[string]*string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if got.Metadata.ResourceVersion != tc.wantRV {
				t.Errorf("resourceVersion = %q, want %q", got.Metadata.ResourceVersion, tc.wantRV)
			}
			raw := got.Metadata.Annotations[contract.AnnotationMigrationStatus]
			if raw == nil {
				t.Fatalf("no status in %s", b)
			}
			back, err := DecodeStatus(*raw)
			if err != nil || back.Name != st.Name || back.Message != st.Message {
				t.Errorf("status read back = %+v (%v), want name %q, message %q", back, err, st.Name, st.Message)
			}
			if sig := got.Metadata.Annotations[contract.AnnotationMigrationStatusSignature]; sig == nil || *sig != statusSignature(key, pod.Namespace, *raw) {
				t.Errorf("signature = %v, want the status's", sig)
			}
			for _, k := range []string{contract.AnnotationMigrateTo, contract.AnnotationMigrateForce} {
				v, present := got.Metadata.Annotations[k]
				if present != tc.removed || v != nil {
					t.Errorf("%s in the patch: present %v (%v), want removed (null): %v", k, present, v, tc.removed)
				}
			}
		})
	}
}
