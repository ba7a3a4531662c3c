package controller

import (
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
