package migrate

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// RollBack takes back migration p of source, which a migrator that stopped
// (killed, say) left half done, by the undo steps a failed Run takes,
// newest first: the target pod goes (for the StatefulSet strategies, the
// shadow and the unused pending-migration ConfigMap), the checkpoint
// images tagged with the migration's name and its shadow's go, and the
// source's sidecar resumes. The caller has made sure that the target did
// not take over (TargetTakeover): deleting one that serves would lose what
// it processed. It returns what could not be undone, for the caller to
// retry; what was undone stays undone.
func RollBack(ctx context.Context, env Env, p Plan, source *corev1.Pod) error {
	r := newRun(env, p)
	r.source, r.others = source, otherApps(source, p.Container)
	// As the phases push them: the checkpoint (resume, images), then the
	// target.
	r.push(r.undoResume(r.endpoint(source)),
		undoStep{name: "delete the checkpoint images", fn: func(ctx context.Context) error {
			return r.dropImages(ctx, append(r.imageTags(p.Name), r.imageTags(ShadowName(p.Name))...))
		}})
	switch p.Strategy {
	case contract.StrategyStatefulSet, contract.StrategyStatefulSetShadow:
		r.push(r.undoPending(), r.undoShadow(ShadowName(p.Name)))
	default:
		r.push(r.undoTarget(p.TargetPod))
	}
	var errs []error
	if handled, out := r.unwindSteps(ctx, nil, func(_ undoStep, err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}); handled {
		return out // no guard here handles (the source was never asked to stop by this run)
	}
	return errors.Join(errs...)
}
