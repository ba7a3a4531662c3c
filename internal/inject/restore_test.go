package inject

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestRestoredFromPod: what a restored pod was made as is read back from
// its status and its sidecar, whether the restore came from annotations
// (a copy) or from a pending migration (a StatefulSet's pod), and not
// from a pod that is no restore.
func TestRestoredFromPod(t *testing.T) {
	byAnnotations := testPod(map[string]string{
		contract.AnnotationRestoreImage: "reg.test/ckpt@sha256:aa", contract.AnnotationRestoreNode: "node-b", contract.AnnotationReplayStart: "85",
		contract.AnnotationReplayCutoff: "marker", contract.AnnotationReplayEpoch: "2", contract.AnnotationLogName: "default.app-x", contract.AnnotationMigrationName: "app-x-tpj70d-b7x2k",
	}, lit(envAMQPURL, "amqp://rabbit"))
	pending := &Migration{Name: "db-0-tpj70d-b7x2k", Image: "reg.test/ckpt@sha256:bb", Node: "node-b", LogName: "default.db-0", ReplayStart: "7", ReplayCutoff: "19"}
	for name, tc := range map[string]struct {
		in     Input
		want   RestoredFrom
		wantOK bool
	}{
		"a copy restored by annotations": {in: restoreInput(byAnnotations, nil), wantOK: true, want: RestoredFrom{
			Migration: "app-x-tpj70d-b7x2k", Image: "reg.test/ckpt@sha256:aa", LogName: "default.app-x", ReplayStart: "85", ReplayCutoff: "marker", ReplayEpoch: "2"}},
		"a StatefulSet's pod restored from its pending migration": {in: restoreInput(testPod(nil, lit(envAMQPURL, "amqp://rabbit")), pending), wantOK: true, want: RestoredFrom{
			Migration: "db-0-tpj70d-b7x2k", Image: "reg.test/ckpt@sha256:bb", LogName: "default.db-0", ReplayStart: "7", ReplayCutoff: "19", ReplayEpoch: "0"}},
		"an injected pod, no restore": {in: Input{Pod: testPod(nil, lit(envAMQPURL, "amqp://rabbit"))}},
	} {
		t.Run(name, func(t *testing.T) {
			res, err := Inject(tc.in, testConfig)
			if err != nil || res.Pod == nil {
				t.Fatalf("inject: %v, %+v", err, res)
			}
			got, ok := RestoredFromPod(res.Pod)
			if ok != tc.wantOK {
				t.Fatalf("RestoredFromPod ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("RestoredFromPod (-want +got):\n%s", diff)
			}
		})
	}
	if _, ok := RestoredFromPod(testPod(nil)); ok {
		t.Error("a pod never injected reads as a restore")
	}
}

// TestRestoreNeedsTheWebhooksKey: a webhook without the controller's key
// verifies nothing, so it restores nothing, signed or not; one with
// another key refuses the signature.
func TestRestoreNeedsTheWebhooksKey(t *testing.T) {
	pending := &Migration{Name: "m", Image: "example.com/ckpt:m", Node: "node-b", LogName: "default.app-0", ReplayStart: "1", ReplayCutoff: "marker"}
	in := restoreInput(testPod(nil, lit(envAMQPURL, "amqp://rabbit")), pending)
	if res, err := Inject(in, testConfig); err != nil || res.Restore == nil {
		t.Fatalf("with the key: %+v, %v; want a restore", res, err)
	}
	for name, tc := range map[string]struct {
		key  []byte
		want string
	}{
		"no key":      {nil, "the webhook has no signing key"},
		"another key": {[]byte("another-signing-key-012345678"), "its signature does not match"},
	} {
		cfg := testConfig
		cfg.RestoreKey = tc.key
		_, err := Inject(in, cfg)
		var deny *DenyError
		if !errors.As(err, &deny) || !strings.Contains(deny.Msg, tc.want) {
			t.Errorf("%s: Inject = %v; want a denial saying %q", name, err, tc.want)
		}
	}
}

// TestRestoreSkip: the IDs a rebuild leaves out of the replay reach the
// sidecar (MS2M_REPLAY_SKIP) and are read back, from annotations and from
// a pending record alike; the signature covers them, and a list that is
// not ascending whole numbers is denied.
func TestRestoreSkip(t *testing.T) {
	annotated := func(skip string) *corev1.Pod {
		return testPod(map[string]string{
			contract.AnnotationRestoreImage: "reg.test/ckpt@sha256:aa", contract.AnnotationRestoreNode: "node-b", contract.AnnotationReplayStart: "85",
			contract.AnnotationReplayCutoff: "120", contract.AnnotationReplayEpoch: "3", contract.AnnotationLogName: "default.app-x", contract.AnnotationMigrationName: "app-x-tpj70d-b7x2k",
			contract.AnnotationReplaySkip: skip,
		}, lit(envAMQPURL, "amqp://rabbit"))
	}
	for name, tc := range map[string]struct {
		in       Input
		tamper   string // the skip list changed after signing
		wantSkip string
		wantDeny string
	}{
		"by annotations": {in: restoreInput(annotated("86,90,91"), nil), wantSkip: "86,90,91"},
		"by a pending record": {in: restoreInput(testPod(nil, lit(envAMQPURL, "amqp://rabbit")),
			&Migration{Name: "db-0-tpj70d-b7x2k", Image: "reg.test/ckpt@sha256:bb", Node: "node-b", LogName: "default.app-0", ReplayStart: "7", ReplayCutoff: "19", ReplaySkip: "8,12"}), wantSkip: "8,12"},
		"changed after signing": {in: restoreInput(annotated("86,90"), nil), tamper: "86", wantDeny: "its signature does not match"},
		"not ascending":         {in: restoreInput(annotated("90,86"), nil), wantDeny: "ms2m.io/replay-skip"},
		"not a number":          {in: restoreInput(annotated("86,x"), nil), wantDeny: "ms2m.io/replay-skip"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.tamper != "" {
				tc.in.Pod.Annotations[contract.AnnotationReplaySkip] = tc.tamper
			}
			res, err := Inject(tc.in, testConfig)
			if tc.wantDeny != "" {
				var deny *DenyError
				if !errors.As(err, &deny) || !strings.Contains(deny.Msg, tc.wantDeny) {
					t.Fatalf("Inject = %v; want a denial saying %q", err, tc.wantDeny)
				}
				return
			}
			if err != nil || res.Pod == nil {
				t.Fatalf("inject: %v, %+v", err, res)
			}
			got, ok := RestoredFromPod(res.Pod)
			if !ok || got.ReplaySkip != tc.wantSkip {
				t.Errorf("RestoredFromPod: %+v (%v), want the skip list %q", got, ok, tc.wantSkip)
			}
		})
	}
	// A copy of a rebuilt pod's spec, restored without a skip list,
	// does not keep the one its sidecar had.
	c := corev1.Container{Env: []corev1.EnvVar{lit(envReplaySkip, "86"), lit("OTHER", "x")}}
	applyRestore(&corev1.Pod{}, &corev1.Container{}, &c, &Migration{Name: "m", Image: "i", Node: "n", LogName: "l", ReplayStart: "1", ReplayCutoff: "2"})
	for _, e := range c.Env {
		if e.Name == envReplaySkip {
			t.Errorf("a restore without a skip list kept %s=%s from the pod it copies", e.Name, e.Value)
		}
	}
}
