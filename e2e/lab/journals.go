package lab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/lab/journal"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// journalPoints says, per strategy, after which phase of migrate.Run a
// consumer has stopped for good and still exists: "source" or "shadow".
// The final target's journal is read at the end. Stop-and-copy (and CRIU
// alone) checkpoint after the source stopped, so the target's journal
// already holds all of the source's.
var journalPoints = map[contract.Strategy]map[string]string{
	contract.StrategyMS2M:              {"replay and handover": "source"},
	contract.StrategyMS2MCutoff:        {"replay and handover": "source"},
	contract.StrategyStatefulSet:       {"stop": "source"},
	contract.StrategyStatefulSetShadow: {"shadow handover": "source", "handover": "shadow"},
}

// Journals collects the journals (GET /folds) of the sample Go consumers
// (examples/consumer, examples/consumer-nats) that serve in turn across
// one migration by migrate.Run: each is read once it has stopped for good
// and before it is deleted. Call AfterPhase
// from the Env's progress callback, and Target once the target has
// processed everything.
type Journals struct {
	l        *Lab
	strategy contract.Strategy
	src      *corev1.Pod
	shadow   string
	read     [][]journal.Fold
	errs     []error
}

// NewJournals collects the journals of plan's migration of src.
func (l *Lab) NewJournals(src *corev1.Pod, plan migrate.Plan) *Journals {
	return &Journals{l: l, strategy: plan.Strategy, src: src, shadow: migrate.ShadowName(plan.Name)}
}

// AfterPhase reads the journal of the instance that phase stopped, if
// it stopped one. It takes a few ms, which fall into the next phase.
func (j *Journals) AfterPhase(ctx context.Context, phase string) {
	switch journalPoints[j.strategy][phase] {
	case "source":
		j.add(j.src)
	case "shadow":
		p, err := j.l.Client.CoreV1().Pods(Namespace).Get(ctx, j.shadow, metav1.GetOptions{})
		if err != nil {
			j.errs = append(j.errs, fmt.Errorf("the shadow pod %s: %w", j.shadow, err))
			return
		}
		j.add(p)
	}
}

// Target reads the final target's journal, once it has processed what it
// is to be judged on.
func (j *Journals) Target(pod *corev1.Pod) { j.add(pod) }

func (j *Journals) add(pod *corev1.Pod) {
	folds, dropped, err := GetFolds(pod)
	switch {
	case err != nil:
		j.errs = append(j.errs, fmt.Errorf("the journal of pod %s (only the Go consumers, AMQP and NATS, keep one): %w", pod.Name, err))
	case dropped > 0:
		j.errs = append(j.errs, fmt.Errorf("the journal of pod %s dropped its %d oldest folds", pod.Name, dropped))
	default:
		j.read = append(j.read, folds)
	}
}

// All is the journals read so far, in the order the instances stopped, the
// final target's last, and an error if one could not be read whole.
func (j *Journals) All() ([][]journal.Fold, error) { return j.read, errors.Join(j.errs...) }

// Gap is the migration's processing gap (journal.ProcessingGap) over the
// window [from, to], with the producer's send times read from the
// journals. It fails when a journal could not be read whole.
func (j *Journals) Gap(from, to time.Time) (journal.Gap, error) {
	all, err := j.All()
	if err != nil {
		return journal.Gap{}, err
	}
	if len(all) == 0 {
		return journal.Gap{}, errors.New("no journal was read")
	}
	return journal.ProcessingGap(all, journal.SendTimes(all), from, to), nil
}

// JournalWatch reads, again and again, the journals of every pod of one
// workload (label app=) while a migration runs that the test does not
// drive itself (one asked for by annotation, run by the controller), so
// that the journal of each instance that stops and is deleted (source,
// shadow) is read while it still exists. It keeps the last whole read of
// each pod, by UID. A fold an instance makes after its last read is
// missing, so the gap it gives is an upper bound, by at most the interval
// between reads: an instance stops consuming at its handover, well before
// the controller deletes it.
type JournalWatch struct {
	stop chan struct{}
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	last map[types.UID][]journal.Fold
	errs map[types.UID]error
}

// WatchJournals starts reading the journals of the pods labelled app=app
// every interval, until Stop.
func (l *Lab) WatchJournals(ctx context.Context, app string, every time.Duration) *JournalWatch {
	w := &JournalWatch{stop: make(chan struct{}), done: make(chan struct{}),
		last: map[types.UID][]journal.Fold{}, errs: map[types.UID]error{}}
	read := func() {
		pods, err := l.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Status.PodIP == "" {
				continue
			}
			folds, dropped, err := GetFolds(p)
			w.mu.Lock()
			switch {
			case err != nil: // not serving yet, or gone: the last read stands
			case dropped > 0:
				w.errs[p.UID] = fmt.Errorf("the journal of pod %s dropped its %d oldest folds", p.Name, dropped)
			default:
				w.last[p.UID] = folds
			}
			w.mu.Unlock()
		}
	}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			read()
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// Close ends the reads; more calls do nothing.
func (w *JournalWatch) Close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// Stop ends the reads and returns the gap over [from, to] from the last
// read of every pod's journal, with target's read once more now (it has
// processed what it is judged on).
func (w *JournalWatch) Stop(target *corev1.Pod, from, to time.Time) (journal.Gap, error) {
	w.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	folds, dropped, err := GetFolds(target)
	switch {
	case err != nil:
		return journal.Gap{}, fmt.Errorf("the journal of pod %s: %w", target.Name, err)
	case dropped > 0:
		return journal.Gap{}, fmt.Errorf("the journal of pod %s dropped its %d oldest folds", target.Name, dropped)
	}
	w.last[target.UID] = folds
	delete(w.errs, target.UID)
	var errs []error
	for _, e := range w.errs {
		errs = append(errs, e)
	}
	if err := errors.Join(errs...); err != nil {
		return journal.Gap{}, err
	}
	all := make([][]journal.Fold, 0, len(w.last))
	for _, f := range w.last {
		all = append(all, f)
	}
	return journal.ProcessingGap(all, journal.SendTimes(all), from, to), nil
}
