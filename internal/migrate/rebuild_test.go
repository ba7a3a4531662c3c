package migrate

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

func TestAppRestartedSince(t *testing.T) {
	pod := func(from string, appRestarts, otherRestarts int32, ann ...string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}, {Name: "other"}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
				{Name: "other", RestartCount: otherRestarts}, {Name: "app", RestartCount: appRestarts}}},
		}
		if from != "" {
			p.Annotations[contract.AnnotationRestoredFrom] = from
		}
		for i := 0; i+1 < len(ann); i += 2 {
			p.Annotations[ann[i]] = ann[i+1]
		}
		return p
	}
	type got struct {
		Restarted bool
		Was, Now  int32
	}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want got
	}{
		"not a restored pod":              {pod("", 3, 0), got{}},
		"no restart since it took over":   {pod(`{"appRestarts":2}`, 2, 0), got{false, 2, 2}},
		"restarted since it took over":    {pod(`{"appRestarts":2}`, 3, 0), got{true, 2, 3}},
		"another app container restarted": {pod(`{"appRestarts":0}`, 0, 5), got{true, 0, 5}}, // a whole pod: it came back from its checkpoint too
		"a stateless container restarted": {pod(`{"appRestarts":0}`, 0, 5, contract.AnnotationContainer, "app"), got{false, 0, 0}},
		"an older record counts from 0":   {pod(`{"migration":"m"}`, 1, 0), got{true, 0, 1}},
		"a bad record counts from 0":      {pod(`not json`, 1, 0), got{true, 0, 1}},
		"a bad record, and no restart":    {pod(`not json`, 0, 0), got{false, 0, 0}},
		"a record above the count (old)":  {pod(`{"appRestarts":9}`, 1, 0), got{false, 9, 1}},
	} {
		t.Run(name, func(t *testing.T) {
			var g got
			g.Restarted, g.Was, g.Now = AppRestartedSince(tc.pod)
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestRebuildPodName(t *testing.T) {
	yes := true
	rsPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "consumer-6b7b6f7786-abcde", UID: "u-1",
		OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "consumer-6b7b6f7786", Controller: &yes}}}}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "worker-ms2m-x2b4c", UID: "u-2"}}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want string // a pattern
	}{
		"a ReplicaSet's pod": {rsPod, `^consumer-6b7b6f7786-[bcdfghjklmnpqrstvwxz2456789]{5}$`},
		"a bare pod":         {bare, `^worker-ms2m-[bcdfghjklmnpqrstvwxz2456789]{5}$`},
	} {
		t.Run(name, func(t *testing.T) {
			got := RebuildPodName(tc.pod)
			if !regexp.MustCompile(tc.want).MatchString(got) {
				t.Errorf("RebuildPodName = %q, want %s", got, tc.want)
			}
			if again := RebuildPodName(tc.pod.DeepCopy()); again != got {
				t.Errorf("RebuildPodName is %q, then %q: a restarted controller must find the same copy", got, again)
			}
			other := tc.pod.DeepCopy()
			other.UID += "x"
			if RebuildPodName(other) == got {
				t.Errorf("two pods get the same copy's name %q", got)
			}
		})
	}
}

func TestSkipIDs(t *testing.T) {
	for name, tc := range map[string]struct {
		had           string
		rq            requeuedSince
		start, cutoff uint64
		want          []uint64
		wantErr       string
	}{
		"none":                                   {start: 10, cutoff: 50},
		"the broker's, in range":                 {rq: requeuedSince{ids: []uint64{3, 11, 12, 50, 51}}, start: 10, cutoff: 50, want: []uint64{11, 12, 50}},
		"the pod's own and the broker's, merged": {had: "14,20", rq: requeuedSince{ids: []uint64{12, 20, 30}}, start: 10, cutoff: 50, want: []uint64{12, 14, 20, 30}},
		"lost below the checkpoint is fine":      {rq: requeuedSince{ids: []uint64{40}, evicted: 9}, start: 10, cutoff: 50, want: []uint64{40}},
		"lost above the checkpoint":              {rq: requeuedSince{ids: []uint64{40}, evicted: 11}, start: 10, cutoff: 50, wantErr: "no longer knows"},
		"a bad list of its own":                  {had: "1,x", start: 0, cutoff: 5, wantErr: "MS2M_REPLAY_SKIP"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := skipIDs(tc.had, tc.rq, tc.start, tc.cutoff)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
