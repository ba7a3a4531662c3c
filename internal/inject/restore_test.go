package inject

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestRestoredFromPod: what a restored pod was made as is read back from
// its status and its sidecar, whether the restore came from annotations
// (a copy) or from a pending migration (a StatefulSet's pod), and not
// from a pod that is no restore.
func TestRestoredFromPod(t *testing.T) {
	byAnnotations := testPod(map[string]string{
		contract.AnnotationRestoreImage: "reg.test/ckpt@sha256:aa", contract.AnnotationRestoreNode: "node-b", contract.AnnotationReplayStart: "85",
		contract.AnnotationReplayCutoff: "marker", contract.AnnotationReplayEpoch: "2", contract.AnnotationLogName: "default.app-x", contract.AnnotationMigrationName: "app-x-tpj70d",
	}, lit(envAMQPURL, "amqp://rabbit"))
	pending := &Migration{Name: "db-0-tpj70d", Image: "reg.test/ckpt@sha256:bb", Node: "node-b", LogName: "default.db-0", ReplayStart: "7", ReplayCutoff: "19"}
	for name, tc := range map[string]struct {
		in     Input
		want   RestoredFrom
		wantOK bool
	}{
		"a copy restored by annotations": {in: restoreInput(byAnnotations, nil), wantOK: true, want: RestoredFrom{
			Migration: "app-x-tpj70d", Image: "reg.test/ckpt@sha256:aa", LogName: "default.app-x", ReplayStart: "85", ReplayCutoff: "marker", ReplayEpoch: "2"}},
		"a StatefulSet's pod restored from its pending migration": {in: restoreInput(testPod(nil, lit(envAMQPURL, "amqp://rabbit")), pending), wantOK: true, want: RestoredFrom{
			Migration: "db-0-tpj70d", Image: "reg.test/ckpt@sha256:bb", LogName: "default.db-0", ReplayStart: "7", ReplayCutoff: "19", ReplayEpoch: "0"}},
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
