package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

func podWith(ann map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: ann}}
}

func TestParseRequest(t *testing.T) {
	for name, tc := range map[string]struct {
		ann     map[string]string
		want    request
		wantErr string
	}{
		"default strategy": {ann: map[string]string{contract.AnnotationMigrateTo: "n2"}, want: request{node: "n2", strategy: contract.StrategyMS2M}},
		"cutoff with replay-max": {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "ms2m-cutoff", contract.AnnotationReplayMax: "8s"},
			want: request{node: "n2", strategy: contract.StrategyMS2MCutoff, replayMax: 8 * time.Second}},
		"stop-and-copy":    {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "stop-and-copy"}, want: request{node: "n2", strategy: contract.StrategyStopAndCopy}},
		"empty node":       {ann: map[string]string{contract.AnnotationMigrateTo: ""}, wantErr: "is empty: name the target node"},
		"unknown strategy": {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "teleport"}, wantErr: `"teleport" is not a strategy`},
		"statefulset":      {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "statefulset"}, want: request{node: "n2", strategy: contract.StrategyStatefulSet}},
		"auto, plain pod":  {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "auto"}, want: request{node: "n2", strategy: contract.StrategyMS2M}},
		"bad replay-max":   {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationReplayMax: "soon"}, wantErr: "replay-max"},
		"adaptive cutoff": {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "ms2m-cutoff", contract.AnnotationCutoff: "adaptive"},
			want: request{node: "n2", strategy: contract.StrategyMS2MCutoff, cutoff: contract.CutoffAdaptive}},
		"bad cutoff rule": {ann: map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationCutoff: "clever"}, wantErr: `annotation ms2m.io/cutoff: unknown cutoff rule "clever" (want formula or adaptive)`},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseRequest(podWith(tc.ann))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestAutoPicksByOwner: auto is statefulset-shadow for a StatefulSet's pod.
func TestAutoPicksByOwner(t *testing.T) {
	yes := true
	p := podWith(map[string]string{contract.AnnotationMigrateTo: "n2", contract.AnnotationStrategy: "auto"})
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web", Controller: &yes}}
	if got, err := parseRequest(p); err != nil || got.strategy != contract.StrategyStatefulSetShadow {
		t.Fatalf("= %+v, %v; want statefulset-shadow", got, err)
	}
	p.OwnerReferences[0].Kind = "ReplicaSet"
	if got, err := parseRequest(p); err != nil || got.strategy != contract.StrategyMS2M {
		t.Fatalf("ReplicaSet pod: = %+v, %v; want ms2m", got, err)
	}
}

func TestStatusRoundTrip(t *testing.T) {
	st := Status{Name: "m", Phase: contract.PhaseRunning, Target: "n2", TargetPod: "m", Started: time.Unix(1, 0).UTC()}
	got, ok, err := statusOf(podWith(map[string]string{contract.AnnotationMigrationStatus: st.encode()}))
	if err != nil || !ok || got.Name != "m" || got.Phase != contract.PhaseRunning || !got.Started.Equal(st.Started) {
		t.Fatalf("statusOf = %+v %v %v", got, ok, err)
	}
	if _, _, err := statusOf(podWith(map[string]string{contract.AnnotationMigrationStatus: "{"})); err == nil {
		t.Error("bad JSON accepted")
	}
}
