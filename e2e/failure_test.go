package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// corruptAgent builds the checkpoint image from a damaged copy of the
// archive: the restore must fail.
type corruptAgent struct{ migrate.NodeAgent }

func (a corruptAgent) BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error) {
	b, err := os.ReadFile(archive)
	if err != nil {
		return "", err
	}
	bad := filepath.Join(os.TempDir(), "corrupt-"+filepath.Base(archive))
	defer os.Remove(bad)
	// Keep the tar headers of the first files and garble the rest.
	for i := len(b) / 8; i < len(b); i += 512 {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		return "", err
	}
	return a.NodeAgent.BuildCheckpointImage(ctx, node, bad, container, ref)
}

// TestFailedMigrationsLeaveTheSourceServing: a checkpoint that fails (CRIU
// refuses) and a restore that fails (a corrupted checkpoint image) both end
// with the source resumed and serving, the half-made target gone, and the
// consumer's hash exact once the producer is done.
func TestFailedMigrationsLeaveTheSourceServing(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, with an agent that corrupts the checkpoint image")
	for _, tc := range []struct {
		name      string
		strategy  contract.Strategy
		nonRoot   bool // CRIU cannot dump a non-root process here: the checkpoint fails
		corrupt   bool // the checkpoint image is damaged: the restore fails
		wantPhase string
	}{
		{name: "checkpoint fails", strategy: contract.StrategyMS2M, nonRoot: true, wantPhase: "checkpoint"},
		{name: "restore fails", strategy: contract.StrategyMS2M, corrupt: true, wantPhase: "the restore failed"},
		{name: "restore fails after stop", strategy: contract.StrategyStopAndCopy, corrupt: true, wantPhase: "the restore failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			name := testenv.UniqueName("f-" + string(tc.strategy))
			plan := migrate.Plan{
				Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
				TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: tc.strategy, Timeout: time.Minute,
			}
			pod, err := l.Pod(lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
			if err != nil {
				t.Fatal(err)
			}
			if tc.nonRoot {
				u := int64(65532)
				pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: &u, RunAsGroup: &u}
			}
			src := createPod(t, ctx, l, pod)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
				defer cancel()
				logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
				logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, testenv.RequireBroker(t).StreamURI, inject.LogName(src)))
			})

			prod := produce(t, src, name, 10, 100, 10)

			env := l.Env(func(phase string, took time.Duration) { t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond)) })
			if tc.corrupt {
				env.Agent = corruptAgent{env.Agent}
			}
			_, err = migrate.Run(ctx, env, plan)
			if err == nil {
				t.Fatal("the migration succeeded; it should have failed")
			}
			t.Logf("migration failed as it should: %v", err)
			if !strings.Contains(err.Error(), tc.wantPhase) || !strings.Contains(err.Error(), "source was resumed") {
				t.Errorf("error %q: want it to name %q and say the source was resumed", err, tc.wantPhase)
			}
			if tc.nonRoot && !strings.Contains(err.Error(), "CRIU says:") {
				t.Errorf("error %q: want CRIU's own error lines", err)
			}
			if _, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{}); err == nil {
				testenv.Eventually(t, time.Minute, "the failed target pod is deleted", func() bool {
					_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
					return err != nil
				})
			}
			if mode := sidecarMode(t, src); mode != "serving" {
				t.Errorf("source sidecar mode %q, want serving", mode)
			}
			want, err := prod.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := lab.WaitFor(src, want, 30*time.Second)
			if got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
				t.Errorf("source consumer after the failed migration: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", got.Count, got.Hash, got.Skipped, want.Count, want.Hash)
			}
		})
	}
}

func createPod(t *testing.T, ctx context.Context, l *lab.Lab, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	admitted, err := l.Admit(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Create(ctx, admitted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, p.Name, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return running
}

// sidecarMode reads the mode of the sidecar in pod, with the control port
// and token the pod's sidecar was given.
func sidecarMode(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	var st struct {
		Mode string `json:"mode"`
	}
	if err := sidecarState(t.Context(), theLab, pod, &st); err != nil {
		t.Fatalf("sidecar state: %v", err)
	}
	return st.Mode
}

// sidecarState reads GET /state of the sidecar in pod into v.
func sidecarState(ctx context.Context, l *lab.Lab, pod *corev1.Pod, v any) error {
	port, token, err := migrate.SidecarGiven(ctx, l.Client, pod)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://%s:%d/state", pod.Status.PodIP, port), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /state of the sidecar in %s: %s: %s", pod.Name, resp.Status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET /state of the sidecar in %s: %q: %w", pod.Name, b, err)
	}
	return nil
}
