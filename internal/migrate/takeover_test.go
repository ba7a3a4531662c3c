package migrate

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/control"
)

// TestTargetTakeover: the rule the migrator's and the controller's
// rollbacks share, against a sidecar's GET /state.
func TestTargetTakeover(t *testing.T) {
	answer := func(code int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body)) // the client's to read
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	switched := answer(http.StatusOK, `{"mode":"serving","replay":{"replaying":0,"switchedAt":"2026-12-04T10:00:00Z"}}`)
	replaying := answer(http.StatusOK, `{"mode":"replaying","replay":{"replaying":1}}`)
	broken := answer(http.StatusInternalServerError, `{"error":"boom"}`)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // nothing listens: connection refused

	pod := func(ip string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Status: corev1.PodStatus{PodIP: ip, Phase: phase}}
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		url   string
		want  Takeover
		error string
	}{
		{"gone", nil, "", NotTakenOver, ""},
		{"never got an IP", pod("", corev1.PodPending), gone.URL, NotTakenOver, ""},
		{"switched", pod("10.0.0.1", corev1.PodRunning), switched, TookOver, ""},
		{"still replaying", pod("10.0.0.1", corev1.PodRunning), replaying, NotTakenOver, ""},
		{"unreachable while it runs", pod("10.0.0.1", corev1.PodRunning), gone.URL, TakeoverUnknown, "cannot tell whether the target t took over"},
		{"failing while it runs", pod("10.0.0.1", corev1.PodRunning), broken, TakeoverUnknown, "boom"},
		{"unreachable and failed", pod("10.0.0.1", corev1.PodFailed), gone.URL, NotTakenOver, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := control.Client{URL: tc.url, Token: "x", HTTP: &http.Client{Timeout: time.Second}}
			got, err := TargetTakeover(t.Context(), SystemClock, tc.pod, c, 0)
			if got != tc.want {
				t.Errorf("= %s (%v), want %s", got, err, tc.want)
			}
			if (tc.error == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.error)) {
				t.Errorf("err = %v, want %q", err, tc.error)
			}
		})
	}
}

// TestTargetTakeoverRetries: a read that fails is retried within retry.
func TestTargetTakeoverRetries(t *testing.T) {
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n++; n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"replay":{"replaying":0,"switchedAt":"2026-12-04T10:00:00Z"}}`)) // the client's to read
	}))
	t.Cleanup(srv.Close)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Status: corev1.PodStatus{PodIP: "10.0.0.1", Phase: corev1.PodRunning}}
	got, err := TargetTakeover(t.Context(), SystemClock, p, control.Client{URL: srv.URL}, 5*time.Second)
	if got != TookOver || err != nil || n != 3 {
		t.Errorf("= %s, %v after %d reads; want took over after 3", got, err, n)
	}
}

// TestTargetTakeoverGivesUpByTheClock: retry is by the clock it is given,
// so a test's clock ends the retries without the time passing.
func TestTargetTakeoverGivesUpByTheClock(t *testing.T) {
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Status: corev1.PodStatus{PodIP: "10.0.0.1", Phase: corev1.PodRunning}}
	clk := &steppingClock{now: time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC), step: 40 * time.Minute}
	got, err := TargetTakeover(t.Context(), clk, p, control.Client{URL: srv.URL}, time.Hour)
	if got != TakeoverUnknown || err == nil {
		t.Errorf("= %s, %v; want unknown, with the read's error", got, err)
	}
	// Each reading of the clock is 40 minutes on: the hour is up at the
	// second read of the sidecar (by the system's clock, after an hour).
	if n != 2 {
		t.Errorf("%d reads of the sidecar; want 2, ended by the clock's hour", n)
	}
}

// steppingClock moves on by step each time it is read.
type steppingClock struct {
	now  time.Time
	step time.Duration
}

func (c *steppingClock) Now() time.Time {
	c.now = c.now.Add(c.step)
	return c.now
}
