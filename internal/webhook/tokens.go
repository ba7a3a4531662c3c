package webhook

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/control"
)

// Control tokens are per namespace, always: the token of namespace ns is
// control.TokenFor(the controller's key, ns), which the controller computes
// for itself. The webhook, which holds the same key, writes it into the
// Secret that an injected pod's sidecar reads (inject.Config.ControlToken,
// in the pod's namespace) before it admits the pod, so the Secret exists
// when the kubelet starts the sidecar, and holds nothing an operator could
// have set alike in every namespace. Other keys of that Secret are kept.

// ensureControlToken makes namespace ns's control-token Secret hold ns's
// token. Without a key (the webhook restores nothing then either), it
// writes nothing: the controller reaches no sidecar.
func (h *Handler) ensureControlToken(ctx context.Context, ns string) error {
	if h.secrets == nil || len(h.cfg.RestoreKey) == 0 {
		return nil
	}
	ref := h.cfg.ControlToken
	want := []byte(control.TokenFor(h.cfg.RestoreKey, ns))
	for attempt := 0; ; attempt++ {
		s := &corev1.Secret{}
		err := h.api.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, s)
		switch {
		case apierrors.IsNotFound(err):
			s = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ref.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "ms2m-webhook"}},
				Type:       corev1.SecretTypeOpaque,
				Data:       map[string][]byte{ref.Key: want},
			}
			err = h.secrets.Create(ctx, s)
		case err != nil:
		case string(s.Data[ref.Key]) == string(want):
			return nil
		default:
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			s.Data[ref.Key] = want
			err = h.secrets.Update(ctx, s)
		}
		if err == nil {
			return nil
		}
		// Another replica, or a pod admitted at the same time, wrote it
		// first: read it again.
		if (apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)) && attempt < 3 {
			continue
		}
		return fmt.Errorf("write namespace %s's control token into Secret %s/%s, key %s: %w (the webhook needs get, create and update on that Secret)", ns, ns, ref.Name, ref.Key, err)
	}
}
