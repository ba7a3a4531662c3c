package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/soak"
	"github.com/ms2m/ms2m/internal/testenv"
)

// pingPongs is how many times TestPingPong moves each workload's pod:
// MS2M_E2E_PINGPONG (make e2e sets 20), else def; 0 leaves the workload
// out (the soak's chunks do, for the last few migrations of a count).
func pingPongs(t *testing.T, env string, def int) int {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count of migrations, 0 or more", env, v)
	}
	return n
}

// TestPingPong: a consumer under load is migrated by annotation again and
// again, from node to node and back, as operators move workloads (drain
// after drain): each migration exact, with the hash equal to the
// producer's and no redelivery skipped at the end; pod names keep their
// workload's form and bounds; the served pod carries no restore
// annotations; a request for the node the pod runs on and a request while
// one runs are refused, each with its Event. After every migration the
// consumer's state is an exact prefix of the producer's messages
// (lab.CheckPrefix: msg-1..msg-n folded once each, none skipped), and at
// the end its hash is the producer's. MS2M_E2E_PINGPONG (default 3) sets
// the Deployment's count; MS2M_E2E_PINGPONG_STS (default 2) the
// StatefulSet's, moved by statefulset-shadow. Under the soak's pingpong
// mode (hack/soak) it appends a record per migration (soakRecorder).
func TestPingPong(t *testing.T) {
	n := pingPongs(t, "MS2M_E2E_PINGPONG", 3)
	nSts := pingPongs(t, "MS2M_E2E_PINGPONG_STS", 2)
	rec := newSoakRecorder(t)
	budget := time.Duration(10+2*(n+nSts)) * time.Minute
	testenv.WatchdogFor(t, budget+5*time.Minute) // the first armed counts: needCluster's 15 minutes are too few for MS2M_E2E_PINGPONG=20
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	l := needMS2M(t, ctx, withController)

	for _, tc := range []struct {
		kind  lab.Kind
		times int
	}{
		{lab.Deployment, n},
		{lab.StatefulSet, nSts},
	} {
		if tc.times == 0 {
			continue
		}
		t.Run(string(tc.kind), func(t *testing.T) {
			pingPong(t, ctx, l, rec, tc.kind, tc.times)
		})
	}
}

func pingPong(t *testing.T, ctx context.Context, l *lab.Lab, rec *soakRecorder, kind lab.Kind, times int) {
	name := testenv.UniqueName("pp")
	src := startWorkload(t, ctx, l, kind, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
	owner := metav1.GetControllerOf(src)
	if owner == nil {
		t.Fatalf("%s has no controller", src.Name)
	}
	// Enough messages to keep the consumer under load through every
	// migration (a real one takes some 8 s, statefulset-shadow twice that).
	rate := 10.0
	prod := produce(t, src, name, rate, int(rate)*(20*times+30), 20)

	pp := pingPonger{l: l, rec: rec, app: name, kind: kind, owner: owner, first: src.Name, times: times, rate: rate}
	cur := src
	for i := 1; i <= times; i++ {
		if rec.stopAsked() {
			t.Logf("the soak asked to stop: %d of %d migrations done", i-1, times)
			prod.Stop()
			if app, err := lab.GetAppState(cur); err != nil || lab.CheckPrefix(app) != nil {
				t.Errorf("the consumer in %s at the stop: %+v (%v, %v), want an exact prefix", cur.Name, app, err, lab.CheckPrefix(app))
			}
			return
		}
		cur = pp.once(t, ctx, cur, i)
	}
	expectExact(t, ctx, prod, cur)
	if app, err := lab.GetAppState(cur); err != nil || app.Skipped != 0 {
		t.Errorf("the consumer in %s at the end: %+v (%v), want no skipped redelivery", cur.Name, app, err)
	}
}

// pingPonger is one workload's ping-pong.
type pingPonger struct {
	l     *lab.Lab
	rec   *soakRecorder
	app   string // the workload's pods' label app=
	kind  lab.Kind
	owner *metav1.OwnerReference
	first string // the first pod's name
	times int
	rate  float64
}

// once migrates cur, the workload's pod, to the other node by annotation
// and returns the pod that took over, once it serves with the consumer's
// state an exact prefix of the producer's messages; it records the
// migration for the soak, also when it fails the test.
func (pp pingPonger) once(t *testing.T, ctx context.Context, cur *corev1.Pod, i int) *corev1.Pod {
	t.Helper()
	l := pp.l
	to := l.NodeName(1 + i%2) // 2, 1, 2, …
	r := soak.Record{Mode: "pingpong", Strategy: string(migrate.ByOwner(cur)), Workload: string(pp.kind), From: cur.Spec.NodeName, To: to, Rate: pp.rate,
		Result: soak.Failed, Outcome: soak.Stuck}
	began := time.Now()
	recorded := false
	defer func() {
		if !recorded { // a Fatal on the way
			r.TotalMS = ms(time.Since(began))
			r.Error = "the test failed in this migration (see its log)"
			pp.rec.add(t, r)
		}
	}()

	journals := l.WatchJournals(ctx, pp.app, 100*time.Millisecond)
	defer journals.Close()
	annotate(t, ctx, l, cur.Name, map[string]any{contract.AnnotationMigrateTo: to})
	waitStarted(t, ctx, l, cur)
	if i == 1 && pp.kind == lab.Deployment {
		// (A StatefulSet's pod is recreated under its name: a request
		// by name could land on the new one.)
		refuseWhileRunning(t, ctx, l, cur)
	}
	target, st := waitMigrated(t, ctx, l, pp.app, cur)
	ended := time.Now()
	rep := st.Report
	if rep == nil {
		t.Fatalf("migration %d: the status of %s has no report: %+v", i, target.Name, st)
	}
	t.Logf("migration %d of %d, %s → %s: %s by %s, total %v, downtime %v", i, pp.times, cur.Spec.NodeName, to, target.Name, rep.Strategy,
		rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond))
	r.Strategy, r.Result, r.TotalMS, r.DowntimeMS = string(rep.Strategy), soak.Completed, ms(rep.Total), ms(rep.Downtime)
	if target.Spec.NodeName != to {
		t.Fatalf("migration %d: %s runs on %s, want %s", i, target.Name, target.Spec.NodeName, to)
	}
	if c := metav1.GetControllerOf(target); c == nil || c.UID != pp.owner.UID {
		t.Errorf("migration %d: %s is controlled by %v, want %s %s", i, target.Name, c, pp.owner.Kind, pp.owner.Name)
	}
	checkName(t, pp.kind, pp.owner.Name, pp.first, target.Name)
	if want := min(i, controller.HistoryLen); len(st.History) < want {
		t.Errorf("migration %d: the status keeps %d earlier requests, want at least %d", i, len(st.History), want)
	}
	target = waitServed(t, ctx, l, target)
	app, err := lab.GetAppState(target)
	if err != nil {
		t.Fatalf("migration %d: the consumer in %s: %v", i, target.Name, err)
	}
	r.Checked = app.Count
	if gap, ok := logWatchedGap(t, fmt.Sprintf("migration %d", i), journals, target, began, ended); ok {
		g := ms(gap)
		r.GapMS = &g
	}
	if err := lab.CheckPrefix(app); err != nil {
		r.Outcome, r.Error = soak.Outcome(lab.PrefixFault(err)), err.Error()
		t.Errorf("migration %d: the consumer in %s: %v", i, target.Name, err)
	} else {
		r.Outcome = soak.Exact
	}
	recorded = true
	pp.rec.add(t, r)
	if i == 1 {
		// The node it runs on: refused, with an Event, nothing touched.
		annotate(t, ctx, l, target.Name, map[string]any{contract.AnnotationMigrateTo: to})
		waitEventSaying(t, ctx, l, target, contract.ReasonMigrationRejected, "already runs on "+to)
		testenv.Eventually(t, 30*time.Second, "the same-node request is answered", func() bool {
			p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
			_, asked := p.Annotations[contract.AnnotationMigrateTo]
			return err == nil && p.UID == target.UID && !asked
		})
		target, _ = l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
	}
	return target
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// soakRecorder appends a soak record per migration (internal/soak) to the
// file MS2M_SOAK_RECORDS names, numbered from MS2M_SOAK_FIRST, with the
// chunk MS2M_SOAK_RUN; the soak's pingpong mode sets them. A file that
// MS2M_SOAK_STOP names, once it exists, asks the test to stop after the
// migration under way. Without MS2M_SOAK_RECORDS it records nothing.
type soakRecorder struct {
	path, run, stop string
	next            int
}

func newSoakRecorder(t *testing.T) *soakRecorder {
	t.Helper()
	r := &soakRecorder{path: os.Getenv("MS2M_SOAK_RECORDS"), run: os.Getenv("MS2M_SOAK_RUN"), stop: os.Getenv("MS2M_SOAK_STOP"), next: 1}
	if v := os.Getenv("MS2M_SOAK_FIRST"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("MS2M_SOAK_FIRST=%q: want the first record's number, 1 or more", v)
		}
		r.next = n
	}
	return r
}

func (r *soakRecorder) add(t *testing.T, rec soak.Record) {
	t.Helper()
	if r.path == "" {
		return
	}
	rec.Index, rec.Run, rec.At = r.next, r.run, time.Now().UTC()
	r.next++
	if err := soak.Append(r.path, rec); err != nil {
		t.Errorf("record migration %d for the soak in %s: %v", rec.Index, r.path, err)
	}
}

func (r *soakRecorder) stopAsked() bool {
	if r.stop == "" {
		return false
	}
	_, err := os.Stat(r.stop)
	return err == nil
}

// waitStarted waits until the request on pod is taken up: its migration
// runs, or has already replaced it, or the request was answered otherwise
// (waitMigrated then says how).
func waitStarted(t *testing.T, ctx context.Context, l *lab.Lab, pod *corev1.Pod) {
	t.Helper()
	was := pod.Annotations[contract.AnnotationMigrationStatus]
	var last *corev1.Pod
	ok := pollWithin(time.Minute, func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID {
			return true
		}
		last = p
		_, asked := p.Annotations[contract.AnnotationMigrateTo]
		v := p.Annotations[contract.AnnotationMigrationStatus]
		return migrationStatus(t, p).Phase == contract.PhaseRunning || (!asked && v != was)
	})
	if !ok {
		var notes []string
		if evs, err := l.Client.EventsV1().Events(lab.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
			for _, e := range evs.Items {
				if e.Regarding.UID == pod.UID {
					notes = append(notes, e.Reason+": "+e.Note)
				}
			}
		}
		t.Fatalf("the request on %s was not taken up within a minute; its annotations %v; its Events %q", pod.Name, last.Annotations, notes)
	}
}

// refuseWhileRunning asks pod, whose migration runs, to move back to the
// node it runs on, and expects the refusal's Event. A migration that ended
// before the request could be made (the pod is gone) is logged, not
// failed.
func refuseWhileRunning(t *testing.T, ctx context.Context, l *lab.Lab, pod *corev1.Pod) {
	t.Helper()
	pods := l.Client.CoreV1().Pods(lab.Namespace)
	_, err := pods.Patch(ctx, pod.Name, types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationMigrateTo, pod.Spec.NodeName), metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		t.Logf("the migration of %s ended before a second request could be made", pod.Name)
		return
	}
	if err != nil {
		t.Fatalf("a second request on %s: %v", pod.Name, err)
	}
	if seen, ok := eventSaying(ctx, l, pod, contract.ReasonMigrationInProgress, "under way"); !ok {
		// A source that is going (its migration ended and handed it to
		// its ReplicaSet to scale down) answers the request as any pod
		// would; the test was late, not the controller.
		now, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && now.DeletionTimestamp != nil) {
			t.Logf("the migration of %s ended before the second request was answered (events %q)", pod.Name, seen)
			return
		}
		t.Fatalf("no Event %s on %s saying %q within 30s, and the pod is not going; its Events: %q", contract.ReasonMigrationInProgress, pod.Name, "under way", seen)
	}
}

// checkName checks that the migrated pod is named as its workload names
// pods, within a hostname's 63 characters.
func checkName(t *testing.T, kind lab.Kind, owner, first, got string) {
	t.Helper()
	if len(got) > migrate.MaxPodNameLen {
		t.Errorf("pod name %s is %d characters, over %d", got, len(got), migrate.MaxPodNameLen)
	}
	switch kind {
	case lab.Deployment:
		if !regexp.MustCompile(`^` + regexp.QuoteMeta(owner) + `-[a-z0-9]{5}$`).MatchString(got) {
			t.Errorf("pod name %s is not of its ReplicaSet %s's form", got, owner)
		}
	case lab.StatefulSet:
		if got != first {
			t.Errorf("the StatefulSet's pod is %s, want %s", got, first)
		}
	}
}

// waitServed waits until pod, which took over, carries no restore
// annotation and records what it was restored from, and returns it.
func waitServed(t *testing.T, ctx context.Context, l *lab.Lab, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got := pod
	testenv.Eventually(t, 30*time.Second, pod.Name+" reads as an ordinary pod of its workload", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID || p.Annotations[contract.AnnotationRestoredFrom] == "" {
			return false
		}
		got = p
		return true
	})
	for _, k := range inject.RestoreRequestAnnotations {
		if v, ok := got.Annotations[k]; ok {
			t.Errorf("%s serves with %s=%s", got.Name, k, v)
		}
	}
	return got
}

// waitEventSaying waits for an Event with reason regarding pod whose note
// contains what.
func waitEventSaying(t *testing.T, ctx context.Context, l *lab.Lab, pod *corev1.Pod, reason, what string) {
	t.Helper()
	if seen, ok := eventSaying(ctx, l, pod, reason, what); !ok {
		t.Fatalf("no Event %s on %s saying %q within 30s; its Events: %q", reason, pod.Name, what, seen)
	}
}

// eventSaying waits up to 30 s for an Event of reason on pod whose note
// contains what, and returns the pod's Events if none came.
func eventSaying(ctx context.Context, l *lab.Lab, pod *corev1.Pod, reason, what string) ([]string, bool) {
	var seen []string
	ok := pollWithin(30*time.Second, func() bool {
		evs, err := l.Client.EventsV1().Events(lab.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if e.Regarding.UID != pod.UID {
				continue
			}
			if e.Reason == reason && strings.Contains(e.Note, what) {
				return true
			}
			seen = append(seen, e.Reason+": "+e.Note)
		}
		return false
	})
	return seen, ok
}

// pollWithin polls cond until it holds or d passes, and says whether it
// held.
func pollWithin(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}
