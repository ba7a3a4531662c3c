package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

func newTestMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestMetricsRecord(t *testing.T) {
	m, reg := newTestMetrics(t)
	ok := Status{Strategy: "ms2m", Report: &migrate.Report{
		Strategy: contract.StrategyMS2M, Total: 6 * time.Second, Downtime: 40 * time.Millisecond,
		Phases: []migrate.Phase{{Name: "checkpoint", Took: 300 * time.Millisecond}, {Name: "restore", Took: 3 * time.Second}},
	}}
	failed := Status{Strategy: "stop-and-copy", Report: &migrate.Report{
		Total: time.Second, Phases: []migrate.Phase{{Name: "preconditions", Took: 2 * time.Millisecond}, {Name: "stop", Took: 20 * time.Millisecond}},
	}}
	m.record(ResultSucceeded, ok)
	m.record(ResultSucceeded, ok)
	m.record(ResultFailed, failed)
	m.record(ResultFailed, Status{Strategy: "ms2m-cutoff"}) // failed before Run: no report
	m.record(ResultRejected, Status{Strategy: "ms2m"})
	m.record(ResultRolledBack, Status{Strategy: "teleport"}) // an edited annotation

	for _, tc := range []struct {
		strategy, result string
		want             float64
	}{
		{"ms2m", "succeeded", 2},
		{"stop-and-copy", "failed", 1},
		{"ms2m-cutoff", "failed", 1},
		{"ms2m", "rejected", 1},
		{"unknown", "rolled_back", 1},
		{"ms2m", "failed", 0},
	} {
		if got := testutil.ToFloat64(m.Migrations.WithLabelValues(tc.strategy, tc.result)); got != tc.want {
			t.Errorf("ms2m_migrations_total{strategy=%q,result=%q} = %v, want %v", tc.strategy, tc.result, got, tc.want)
		}
	}

	// Totals and downtimes only of migrations that succeeded; phases of
	// every migration that ran.
	want := `
# HELP ms2m_migration_downtime_seconds Time no consumer took messages from the queue during a migration that succeeded, by strategy.
# TYPE ms2m_migration_downtime_seconds histogram
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.001"} 0
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.0025"} 0
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.005"} 0
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.01"} 0
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.025"} 0
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.05"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.1"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.25"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="0.5"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="1"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="2.5"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="5"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="10"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="30"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="60"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="120"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="300"} 2
ms2m_migration_downtime_seconds_bucket{strategy="ms2m",le="+Inf"} 2
ms2m_migration_downtime_seconds_sum{strategy="ms2m"} 0.08
ms2m_migration_downtime_seconds_count{strategy="ms2m"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ms2m_migration_downtime_seconds"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Duration); n != 1 {
		t.Errorf("ms2m_migration_duration_seconds has %d series, want 1 (ms2m's)", n)
	}
	for _, tc := range []struct {
		strategy, phase string
		wantCount       uint64
		wantSum         float64
	}{
		{"ms2m", "checkpoint", 2, 0.6},
		{"ms2m", "restore", 2, 6},
		{"stop-and-copy", "preconditions", 1, 0.002},
		{"stop-and-copy", "stop", 1, 0.02},
	} {
		count, sum := histogram(t, reg, "ms2m_migration_phase_duration_seconds", map[string]string{"strategy": tc.strategy, "phase": tc.phase})
		if count != tc.wantCount || !near(sum, tc.wantSum) {
			t.Errorf("phase %s of %s: count %d sum %v, want %d and %v", tc.phase, tc.strategy, count, sum, tc.wantCount, tc.wantSum)
		}
	}
	if n := testutil.CollectAndCount(m.PhaseDuration); n != 4 {
		t.Errorf("ms2m_migration_phase_duration_seconds has %d series, want 4", n)
	}
	count, sum := histogram(t, reg, "ms2m_migration_duration_seconds", map[string]string{"strategy": "ms2m"})
	if count != 2 || !near(sum, 12) {
		t.Errorf("ms2m_migration_duration_seconds{strategy=ms2m}: count %d sum %v, want 2 and 12", count, sum)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestMetricsRunning(t *testing.T) {
	m, _ := newTestMetrics(t)
	m.started()
	m.started()
	m.stopped()
	if got := testutil.ToFloat64(m.Running); got != 1 {
		t.Errorf("ms2m_migrations_running = %v, want 1", got)
	}
}

func TestNewMetricsShares(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("second NewMetrics on one registry: %v", err)
	}
	b.record(ResultRejected, Status{Strategy: "ms2m"})
	if got := testutil.ToFloat64(a.Migrations.WithLabelValues("ms2m", "rejected")); got != 1 {
		t.Errorf("the first Metrics sees %v rejections, want the second's 1", got)
	}
}

// TestReconcileCountsRejections runs the Reconciler on a pod without the
// sidecar: the request is refused, recorded, and counted.
func TestReconcileCountsRejections(t *testing.T) {
	m, _ := newTestMetrics(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "consumer-0",
		Annotations: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "stop-and-copy"}}}
	cs := fake.NewClientset(pod)
	r := New(Config{Client: cs, Events: discard{}, Metrics: m})
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "shop", Name: "consumer-0"}}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Migrations.WithLabelValues("stop-and-copy", "rejected")); got != 1 {
		t.Errorf("rejections = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Running); got != 0 {
		t.Errorf("running = %v, want 0", got)
	}
	got, err := cs.CoreV1().Pods("shop").Get(t.Context(), "consumer-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, ok, err := statusOf(got)
	if err != nil || !ok || st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, "no ms2m sidecar") {
		t.Errorf("status %+v %v %v, want Failed for the missing sidecar", st, ok, err)
	}
}

type discard struct{}

func (discard) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}

// histogram returns the sample count and sum of the series of name with
// labels.
func histogram(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return mt.GetHistogram().GetSampleCount(), mt.GetHistogram().GetSampleSum()
		}
	}
	return 0, 0
}

func near(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 }
