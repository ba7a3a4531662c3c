package migrate

import (
	"context"
	"errors"
	"fmt"
)

// A migration is a list of phases. Each phase does one thing that a
// failure later on must take back (quiesce the source, stop it, push a
// checkpoint image, create the target) and, once it has done it, pushes
// the steps that take it back. A failure unwinds the steps pushed so far,
// newest first; the point of no return (the target took over) drops them.
// RollBack, the controller's rollback of a migration that a stopped
// migrator left behind, runs the same steps.

// undoStep takes back what a phase did.
type undoStep struct {
	name string
	// fn does it, and returns what went wrong.
	fn func(ctx context.Context) error
	// done, if set, is what the migration's error adds once fn succeeded
	// ("the source was resumed and keeps serving").
	done string
	// guard, if set, runs before fn and may end the unwinding: handled
	// says that nothing older is to be undone, and out is then the
	// migration's outcome (afterStop: the target took over, or cannot be
	// read).
	guard func(ctx context.Context, cause error) (handled bool, out error)
}

// phase is one step of a migration: do, and once it succeeded, push undo
// (in order; none when there is nothing to take back).
type phase struct {
	name string
	do   func(ctx context.Context) error
	undo []undoStep
}

// push registers undo steps of what a phase did.
func (r *run) push(steps ...undoStep) {
	r.undo = append(r.undo, steps...)
}

// commit drops the undo steps: the migration is past its point of no
// return, and a failure from here on leaves everything where it is.
func (r *run) commit() { r.undo = nil }

// runPhases runs ps in order. On the first failure it unwinds the undo
// steps pushed so far and returns the migration's error, named with the
// migration.
func (r *run) runPhases(ctx context.Context, ps ...phase) error {
	for _, ph := range ps {
		if err := ph.do(ctx); err != nil {
			r.log.Info("phase failed", "phase", ph.name, "err", err.Error())
			return r.unwind(ctx, fmt.Errorf("migration %s: %w", r.p.Name, err))
		}
		r.push(ph.undo...)
	}
	return nil
}

// unwind runs the undo steps newest first after err, and returns err with
// what they did and what they could not do.
func (r *run) unwind(ctx context.Context, err error) error {
	handled, out := r.unwindSteps(ctx, err, func(s undoStep, ferr error) {
		switch {
		case ferr != nil:
			err = errors.Join(err, ferr)
		case s.done != "":
			err = fmt.Errorf("%w (%s)", err, s.done)
		}
	})
	if handled {
		return out
	}
	return err
}

// unwindSteps runs the undo steps newest first and drops them, each on a
// context of its own (cleanupContext), telling each outcome to each. A
// guard that handles the failure ends it: it returns handled and the
// outcome.
func (r *run) unwindSteps(ctx context.Context, cause error, each func(s undoStep, err error)) (handled bool, out error) {
	steps := r.undo
	r.undo = nil
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		cctx, cancel := r.cleanupContext(ctx)
		if s.guard != nil {
			if handled, out = s.guard(cctx, cause); handled {
				cancel()
				r.log.Info("undo ended: nothing older is undone", "step", s.name)
				return true, out
			}
		}
		var err error
		if s.fn != nil {
			err = s.fn(cctx)
		}
		cancel()
		if err != nil {
			r.log.Error(err, "undo failed", "step", s.name)
		} else {
			r.log.Info("undone", "step", s.name)
		}
		each(s, err)
	}
	return false, nil
}

// cleanupContext is the context of a step that takes something back: it
// outlives ctx, so that a migration whose context ended still cleans up,
// and is bounded by Timeouts.Cleanup.
func (r *run) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.env.Timeouts.Cleanup)
}
