package inject

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/sign"
)

// A restore instruction (the restore annotations, or a pending Migration)
// turns a pod into a restore of a checkpoint: the app's memory. Only
// ms2m's controller may give one, so it signs each with its key, and the
// webhook restores only what it can verify. The signature binds the pod's
// namespace and name, the migration, the image, the node, the log and the
// replay range, and an expiry: a tenant can neither write an instruction,
// nor change one, nor copy one to a pod of another name or namespace, nor
// use one after it expired.
//
// The value is "<expiry, Unix seconds>.<MAC>", in contract.AnnotationRestoreSignature
// or Migration.Signature.
const restoreSigContext = "ms2m.io/restore/v1"

// DefaultRestoreValidity is how long a restore instruction stays valid
// after the migrator signed it, unless it says otherwise: long enough for
// a StatefulSet to make its pod again on a slow cluster.
const DefaultRestoreValidity = time.Hour

func restoreParts(namespace, pod, expiry string, m Migration) []string {
	epoch := m.ReplayEpoch
	if epoch == "" {
		epoch = "0"
	}
	parts := []string{namespace, pod, expiry, m.Name, m.Image, m.Node, m.LogName, m.ReplayStart, m.ReplayCutoff, epoch}
	if m.ReplaySkip != "" {
		parts = append(parts, "skip="+m.ReplaySkip)
	}
	if len(m.Images) > 0 {
		parts = append(parts, "images="+EncodeImages(m.Images))
	}
	return parts
}

// SignRestore is the signature of restore m for pod namespace/pod, valid
// until expires: the value of contract.AnnotationRestoreSignature, or of a pending
// Migration's Signature (which it does not cover).
func SignRestore(key []byte, namespace, pod string, m Migration, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	return exp + "." + sign.MAC(key, restoreSigContext, restoreParts(namespace, pod, exp, m)...)
}

// checkRestoreSignature says why restore m, from where (the annotation or
// the pending-migration ConfigMap), may not be applied to pod
// namespace/pod: "" when its signature verifies with cfg's key and has not
// expired. unsigned is what to do about an instruction without one.
func checkRestoreSignature(cfg Config, namespace, pod, where, unsigned string, m *Migration) string {
	only := "only ms2m's controller can order a restore"
	if len(cfg.RestoreKey) == 0 {
		return fmt.Sprintf("%s asks for a restore, but the webhook has no signing key to check it with (MS2M_WEBHOOK_SIGNING_KEY_FILE, the chart's Secret ms2m-migration-status-key): %s, and none is admitted unverified", where, only)
	}
	if m.Signature == "" {
		return fmt.Sprintf("%s has no signature: %s; %s", where, only, unsigned)
	}
	if pod == "" {
		return fmt.Sprintf("%s is for a pod without a name (generateName): the controller names every pod it restores", where)
	}
	exp, mac, ok := strings.Cut(m.Signature, ".")
	secs, err := strconv.ParseInt(exp, 10, 64)
	if !ok || err != nil || exp != strconv.FormatInt(secs, 10) {
		return fmt.Sprintf("%s: signature %s is not <expiry>.<MAC> as the controller writes it: %s", where, quote(m.Signature), only)
	}
	if !sign.Valid(cfg.RestoreKey, mac, restoreSigContext, restoreParts(namespace, pod, exp, *m)...) {
		return fmt.Sprintf("%s: its signature does not match: it was not signed by ms2m's controller, was changed since, or was signed for another pod or namespace than %s/%s: %s", where, namespace, pod, only)
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	if at := time.Unix(secs, 0); !now().Before(at) {
		return fmt.Sprintf("%s: its signature expired at %s: migrate again to get a new one", where, at.UTC().Format(time.RFC3339))
	}
	return ""
}
