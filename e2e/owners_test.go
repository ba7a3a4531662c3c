package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestStatefulSetStrategies moves a StatefulSet's pod, an unmodified Go
// consumer that the real webhook injected, from node 1 to node 2 with the
// paper's statefulset strategy and with statefulset-shadow: the pod of the
// same name ends up on node 2, owned by its StatefulSet, restored by the
// webhook from the pending-migration record, with the producer's hash.
// The only pods ever made are the shadow (for statefulset-shadow) and the
// recreated pod: none started with empty state.
func TestStatefulSetStrategies(t *testing.T) {
	l := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	if _, err := l.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.StopWebhook() })
	for _, strategy := range []migrate.Strategy{migrate.StatefulSetShadow, migrate.StatefulSet} {
		t.Run(string(strategy), func(t *testing.T) {
			name := testenv.UniqueName("ss")
			tmpl := podTemplate(t, l, name)
			one := int32(1)
			sts := &appsv1.StatefulSet{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lab.Namespace},
				Spec: appsv1.StatefulSetSpec{
					Replicas: &one, ServiceName: name, Template: tmpl,
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				},
			}
			pods := watchPods(t, ctx, l, name)
			if _, err := l.Client.AppsV1().StatefulSets(lab.Namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			podName := name + "-0"
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				l.Client.AppsV1().StatefulSets(lab.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
				l.Client.CoreV1().ConfigMaps(lab.Namespace).Delete(ctx, inject.PendingConfigMapName(podName), metav1.DeleteOptions{})
				l.DeletePods(ctx, podName)
				b := testenv.RequireBroker(t)
				shadowqueue.DeleteStream(ctx, b.StreamURI, lab.Namespace+"."+podName)
			})
			src := waitPod(t, ctx, l, podName, "")
			if _, ok := src.Annotations[inject.AnnotationStatus]; !ok {
				t.Fatalf("the webhook did not inject %s", podName)
			}
			prod := produce(t, src, name, 10, 150, 20)

			plan := migrate.Plan{Name: fmt.Sprintf("%s-m%d", podName, time.Now().UnixNano()%1e6), Namespace: lab.Namespace, Pod: podName, Container: "app",
				TargetNode: cluster.NodeName(2), Strategy: migrate.Auto}
			if strategy == migrate.StatefulSet {
				plan.Strategy = strategy
			}
			rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
				t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
			}), plan)
			if err != nil {
				t.Fatalf("migrate: %v", err)
			}
			if rep.Strategy != strategy {
				t.Errorf("ran %s, want %s", rep.Strategy, strategy)
			}
			t.Logf("%s: total %v, downtime %v, checkpoint %d, shadow checkpoint %d, cutoff %d", rep.Strategy, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.ShadowCheckpoint, rep.CutoffID)

			target := waitPod(t, ctx, l, podName, src.UID)
			if target.Spec.NodeName != cluster.NodeName(2) {
				t.Errorf("%s runs on %s, want %s", podName, target.Spec.NodeName, cluster.NodeName(2))
			}
			if c := metav1.GetControllerOf(target); c == nil || c.Kind != "StatefulSet" || c.Name != name {
				t.Errorf("%s is controlled by %v, want StatefulSet %s", podName, c, name)
			}
			if _, err := l.Client.CoreV1().ConfigMaps(lab.Namespace).Get(ctx, inject.PendingConfigMapName(podName), metav1.GetOptions{}); err == nil {
				t.Errorf("the pending-migration ConfigMap is still there")
			}
			if rep.ShadowPod != "" {
				testenv.Eventually(t, time.Minute, "the shadow is gone", func() bool {
					_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, rep.ShadowPod, metav1.GetOptions{})
					return err != nil
				})
			}
			expectExact(t, ctx, prod, target)
			made := pods.created()
			wantMade := 2 // the first pod and the recreated one
			if strategy == migrate.StatefulSetShadow {
				wantMade = 3 // and the shadow
			}
			if len(made) != wantMade {
				t.Errorf("pods made: %v, want %d", made, wantMade)
			}
			for _, p := range made {
				if p.restore == "" && p.uid != src.UID {
					t.Errorf("pod %s (%s) was started without a restore: empty state", p.name, p.uid)
				}
			}
		})
	}
}

// TestDeploymentPodStaysOwned moves a Deployment's pod by ms2m: the target
// is held until it serves, then its ReplicaSet adopts it; the ReplicaSet
// never starts a fresh replica, and the hash is exact.
func TestDeploymentPodStaysOwned(t *testing.T) {
	l := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := l.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.StopWebhook() })
	name := testenv.UniqueName("dep")
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lab.Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one, Template: podTemplate(t, l, name),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
		},
	}
	pods := watchPods(t, ctx, l, name)
	if _, err := l.Client.AppsV1().Deployments(lab.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var src *corev1.Pod
	testenv.Eventually(t, 2*time.Minute, "the Deployment's pod runs", func() bool {
		made := pods.created()
		if len(made) == 0 {
			return false
		}
		p, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, made[0].name, 2*time.Minute)
		src = p
		return err == nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		l.Client.AppsV1().Deployments(lab.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		b := testenv.RequireBroker(t)
		shadowqueue.DeleteStream(ctx, b.StreamURI, inject.LogName(src))
	})
	rsOwner := metav1.GetControllerOf(src)
	if rsOwner == nil || rsOwner.Kind != "ReplicaSet" {
		t.Fatalf("the source is controlled by %v, want a ReplicaSet", rsOwner)
	}
	prod := produce(t, src, name, 10, 150, 20)
	plan := migrate.Plan{Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: src.Name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: src.Name + "-moved", Strategy: migrate.Auto}
	rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
	}), plan)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("%s: total %v, downtime %v", rep.Strategy, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond))
	target, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, plan.TargetPod, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c := metav1.GetControllerOf(target); c == nil || c.UID != rsOwner.UID {
		t.Errorf("the target is controlled by %v, want ReplicaSet %s", c, rsOwner.Name)
	}
	expectExact(t, ctx, prod, target)
	time.Sleep(3 * time.Second) // a ReplicaSet that wanted another replica has made it by now
	if made := pods.created(); len(made) != 2 {
		t.Errorf("pods made: %v, want the source and the target only", made)
	}
	rs, err := l.Client.AppsV1().ReplicaSets(lab.Namespace).Get(ctx, rsOwner.Name, metav1.GetOptions{})
	if err != nil || rs.Status.Replicas != 1 {
		t.Errorf("ReplicaSet %s: %v replicas (%v), want 1", rsOwner.Name, rs.Status.Replicas, err)
	}
}

// podTemplate is the lab's consumer pod for queue name, as a template.
func podTemplate(t *testing.T, l *lab.Lab, name string) corev1.PodTemplateSpec {
	t.Helper()
	p, err := l.Pod(lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, Annotations: p.Annotations}, Spec: p.Spec}
}

// waitPod waits until pod name, other than the one with UID not, runs.
func waitPod(t *testing.T, ctx context.Context, l *lab.Lab, name string, not types.UID) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	testenv.Eventually(t, 3*time.Minute, "pod "+name+" runs", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || (not != "" && p.UID == not) {
			return false
		}
		p, err = migrate.WaitRunning(ctx, l.Client, lab.Namespace, name, 5*time.Second)
		got = p
		return err == nil
	})
	return got
}

// madePod is a pod seen created.
type madePod struct {
	name, restore string
	uid           types.UID
}

type podLog struct {
	mu   sync.Mutex
	seen map[types.UID]madePod
	list []madePod
}

func (pl *podLog) created() []madePod {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return append([]madePod(nil), pl.list...)
}

// watchPods records every pod with label app=app that is created, and
// whether the webhook made it a restore.
func watchPods(t *testing.T, ctx context.Context, l *lab.Lab, app string) *podLog {
	t.Helper()
	w, err := l.Client.CoreV1().Pods(lab.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	pl := &podLog{seen: map[types.UID]madePod{}}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Added {
				continue
			}
			st := p.Annotations[inject.AnnotationStatus]
			restore := ""
			if _, ok := p.Annotations[inject.AnnotationRestoreImage]; ok || containsRestore(st) {
				restore = "yes"
			}
			pl.mu.Lock()
			if _, dup := pl.seen[p.UID]; !dup {
				m := madePod{name: p.Name, restore: restore, uid: p.UID}
				pl.seen[p.UID] = m
				pl.list = append(pl.list, m)
			}
			pl.mu.Unlock()
		}
	}()
	return pl
}

func containsRestore(status string) bool {
	var st inject.Status
	return json.Unmarshal([]byte(status), &st) == nil && st.Restore != ""
}
