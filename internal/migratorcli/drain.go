package migratorcli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
)

// The outcomes of a pod in a drain.
const (
	drainMigrated = "migrated" // it left by its migration (every eviction refused)
	drainEvicted  = "evicted"  // an eviction went through: it was not opted in, or overridden
	drainFailed   = "failed"   // its migration failed: it serves on the node
	drainTimeout  = "timeout"  // still there when the drain's time ran out
	drainError    = "error"    // an eviction failed otherwise
)

// drainRow is one pod of a drain, as the table shows it.
type drainRow struct {
	Pod      string // namespace/name
	Strategy string
	Phase    string // the migration's phase, or the eviction's state
	Started  time.Time
	Ended    time.Time
	Downtime time.Duration
	Outcome  string // "" while under way
	Message  string // the last refusal, or the failure
}

func drainCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up on the pods still on the node after this long")
	retry := fs.Duration("retry", 2*time.Second, "wait between a refused eviction and the next")
	refresh := fs.Duration("refresh", time.Second, "how often the table is drawn again")
	selector := fs.String("pod-selector", "", "only the pods with these labels (a label selector, as kubectl drain's --pod-selector)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "migrator drain: give one node: migrator drain <node>")
		return 2
	}
	node := fs.Arg(0)
	cs, err := kubeClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "migrator drain: %v\n", err)
		return 1
	}
	rows, err := drain(ctx, cs, node, drainOptions{Timeout: *timeout, Retry: *retry, Refresh: *refresh, Selector: *selector, Out: stdout, Live: isTerminal(stdout)})
	if err != nil {
		fmt.Fprintf(stderr, "migrator drain: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, drainSummary(node, rows))
	for _, r := range rows {
		if r.Outcome != drainMigrated && r.Outcome != drainEvicted {
			return 1
		}
	}
	return 0
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

type drainOptions struct {
	Timeout, Retry, Refresh time.Duration
	Selector                string // a label selector; "" for every pod
	Out                     io.Writer
	// Live redraws the table in place (a terminal); otherwise each
	// change of a pod's phase is printed as a line.
	Live bool
}

// drain cordons node and evicts every pod on it but DaemonSet and mirror
// pods, as kubectl drain does: a refused eviction (429) is asked again,
// a pod is done once it is gone. A pod whose evacuation failed is given
// up at once (its refusal says why). It returns every pod's row.
func drain(ctx context.Context, cs kubernetes.Interface, node string, o drainOptions) ([]drainRow, error) {
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("cordon %s: %w", node, err)
	}
	list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(), LabelSelector: o.Selector})
	if err != nil {
		return nil, fmt.Errorf("list the pods on %s: %w", node, err)
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if drainSkips(&p) {
			continue
		}
		pods = append(pods, p)
	}
	var mu sync.Mutex
	rows := make([]drainRow, len(pods))
	now := time.Now()
	for i, p := range pods {
		rows[i] = drainRow{Pod: p.Namespace + "/" + p.Name, Phase: "evicting", Started: now}
	}
	update := func(i int, f func(*drainRow)) {
		mu.Lock()
		defer mu.Unlock()
		before := rows[i]
		f(&rows[i])
		if !o.Live && (before.Phase != rows[i].Phase || before.Outcome != rows[i].Outcome || before.Downtime != rows[i].Downtime) {
			r := rows[i]
			line := fmt.Sprintf("%s  %s  %s  %s", time.Now().UTC().Format(time.TimeOnly), r.Pod, orDash(r.Strategy), r.Phase)
			if r.Outcome != "" {
				line += fmt.Sprintf("  elapsed %s", r.Ended.Sub(r.Started).Round(100*time.Millisecond))
			}
			if r.Downtime != 0 {
				line += fmt.Sprintf("  downtime %s", r.Downtime.Round(time.Millisecond))
			}
			fmt.Fprintln(o.Out, line)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			drainPod(dctx, cs, node, p, o.Retry, func(f func(*drainRow)) { update(i, f) })
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(o.Refresh)
	defer tick.Stop()
	for {
		select {
		case <-done:
			mu.Lock()
			defer mu.Unlock()
			if o.Live {
				fmt.Fprint(o.Out, "\x1b[H\x1b[2J"+drainTable(rows, time.Now()))
			}
			return append([]drainRow(nil), rows...), nil
		case <-tick.C:
			if o.Live {
				mu.Lock()
				fmt.Fprint(o.Out, "\x1b[H\x1b[2J"+drainTable(rows, time.Now()))
				mu.Unlock()
			}
		}
	}
}

// drainSkips says whether a drain leaves pod alone: a mirror pod (the
// API cannot delete it), a DaemonSet's (its controller ignores the
// cordon), or one that has finished or is being deleted.
func drainSkips(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	if o := metav1.GetControllerOf(p); o != nil && o.Kind == "DaemonSet" {
		return true
	}
	return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// drainPod evicts p until it is gone from node, and keeps its row.
func drainPod(ctx context.Context, cs kubernetes.Interface, node string, p corev1.Pod, retry time.Duration, update func(func(*drainRow))) {
	pods := cs.CoreV1().Pods(p.Namespace)
	var migration controller.Status // the last status seen of its evacuation
	end := func(outcome, msg string) {
		update(func(r *drainRow) {
			r.Outcome, r.Ended = outcome, time.Now()
			if msg != "" {
				r.Message = msg
			}
			switch outcome {
			case drainMigrated:
				r.Phase = string(contract.PhaseSucceeded)
			case drainEvicted:
				r.Phase = "evicted"
			default:
				r.Phase = outcome
			}
		})
	}
	evicted := false
	for {
		cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != p.UID) {
			if evicted {
				end(drainEvicted, "")
			} else {
				end(drainMigrated, "")
				readOutcome(ctx, pods, migration, update)
			}
			return
		}
		if err == nil {
			if st, err := controller.DecodeStatus(cur.Annotations[contract.AnnotationMigrationStatus]); err == nil && st.Evacuation == node {
				migration = st
				update(func(r *drainRow) {
					r.Strategy, r.Phase = st.Strategy, string(st.Phase)
					if st.Report != nil {
						r.Downtime = st.Report.Downtime
					}
				})
				if st.Phase == contract.PhaseFailed || st.Phase == contract.PhaseRolledBack {
					end(drainFailed, st.Message)
					return
				}
			}
		}
		// A pod being deleted (by its migration's last step, say) is
		// waited for, not evicted: its eviction would pass and say nothing.
		if !evicted && (err != nil || cur.DeletionTimestamp == nil) {
			err = cs.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
			switch {
			case err == nil:
				evicted = true
				update(func(r *drainRow) { r.Phase = "evicted, terminating" })
			case apierrors.IsNotFound(err):
				// Gone, or (a StatefulSet's pod back under its name) moved
				// off this node: the next read says which.
			case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
				// Its namespace is being deleted: the pod goes with it
				// (kubectl drain waits the same way).
				update(func(r *drainRow) { r.Phase, r.Message = "namespace terminating", err.Error() })
			case apierrors.IsTooManyRequests(err):
				update(func(r *drainRow) {
					r.Message = err.Error()
					if migration.Name == "" {
						r.Phase = "waiting"
					}
				})
			case ctx.Err() == nil:
				end(drainError, err.Error())
				return
			}
		}
		select {
		case <-ctx.Done():
			end(drainTimeout, "")
			return
		case <-time.After(retry):
		}
	}
}

// readOutcome fills a migrated pod's row from its target's record: the
// source takes no status with it when it goes.
func readOutcome(ctx context.Context, pods interface {
	Get(context.Context, string, metav1.GetOptions) (*corev1.Pod, error)
}, st controller.Status, update func(func(*drainRow))) {
	if st.TargetPod == "" {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t, err := pods.Get(ctx, st.TargetPod, metav1.GetOptions{})
		if err == nil {
			if got, err := controller.DecodeStatus(t.Annotations[contract.AnnotationMigrationStatus]); err == nil && got.Name == st.Name && got.Phase != contract.PhaseRunning {
				update(func(r *drainRow) {
					r.Strategy = got.Strategy
					if got.Report != nil {
						r.Downtime = got.Report.Downtime
					}
				})
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// drainTable is the live table: pod, strategy, phase, elapsed, downtime.
func drainTable(rows []drainRow, now time.Time) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tSTRATEGY\tPHASE\tELAPSED\tDOWNTIME")
	for _, r := range sortedRows(rows) {
		end := now
		if !r.Ended.IsZero() {
			end = r.Ended
		}
		down := "-"
		if r.Downtime != 0 {
			down = r.Downtime.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Pod, orDash(r.Strategy), r.Phase, end.Sub(r.Started).Round(100*time.Millisecond), down)
	}
	_ = tw.Flush()
	return b.String()
}

// drainSummary counts the outcomes and names every pod that did not move.
func drainSummary(node string, rows []drainRow) string {
	count := map[string]int{}
	var took time.Duration
	var b strings.Builder
	for _, r := range sortedRows(rows) {
		count[r.Outcome]++
		took = max(took, r.Ended.Sub(r.Started))
		if r.Outcome != drainMigrated && r.Outcome != drainEvicted {
			fmt.Fprintf(&b, "  %s: %s: %s\n", r.Pod, r.Outcome, orDash(r.Message))
		}
	}
	head := fmt.Sprintf("drain %s: %d pods in %s: %d migrated, %d evicted, %d failed, %d timed out, %d errors\n",
		node, len(rows), took.Round(100*time.Millisecond), count[drainMigrated], count[drainEvicted], count[drainFailed], count[drainTimeout], count[drainError])
	if b.Len() > 0 {
		head += "not moved (the node is still cordoned):\n" + b.String()
	}
	return head
}

func sortedRows(rows []drainRow) []drainRow {
	out := append([]drainRow(nil), rows...)
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
