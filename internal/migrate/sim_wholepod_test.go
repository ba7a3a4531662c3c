package migrate_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// twoContainerTemplate is podTemplate with a second stateful app
// container, "audit", which consumes a queue of its own through the same
// sidecar (a whole pod).
func twoContainerTemplate() corev1.PodTemplateSpec {
	tmpl := podTemplate(true)
	tmpl.Spec.Containers = append(tmpl.Spec.Containers, corev1.Container{Name: "audit", Image: "sim.test/audit:1",
		Env: []corev1.EnvVar{{Name: "AMQP_URL", Value: "amqp://guest:guest@rabbitmq.default:5672/"}}})
	return tmpl
}

// TestTwoContainerPod: a pod with two stateful app containers, each on
// its own queue, is migrated whole by ms2m and by statefulset: each
// container is restored from a checkpoint image of its own and has
// processed every delivery of its queue once; the images go once the
// target serves. A failure of the second container's checkpoint, or of
// its image's push, rolls the migration back as for one container: the
// source serves on, exact, and no image is left.
func TestTwoContainerPod(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		strategy contract.Strategy
		owner    string
	}{
		{contract.StrategyMS2M, "Deployment"},
		{contract.StrategyStatefulSet, "StatefulSet"},
	} {
		t.Run(string(tc.strategy), func(t *testing.T) {
			resetNodes(c)
			w := deployWith(t, c, "sim-pod2-"+string(tc.strategy), tc.owner, twoContainerTemplate(), nil)
			t.Cleanup(func() { scaleToZero(t, c, w) }) // their addresses back before the next test
			p := plan(w, tc.strategy)
			rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
			if err != nil {
				t.Fatalf("migrate: %v", err)
			}
			if h := rep.Hold; h == nil || h.AtFreeze || !strings.Contains(h.Fallback, "2 app containers") {
				t.Errorf("the hold %+v: want it held for both checkpoint calls, and the report to say so", h)
			}
			audit := rep.Images["audit"]
			if !strings.HasPrefix(audit, c.ImageRepo()+"/"+w.ns+"@sha256:") || audit == rep.Image || len(rep.Images) != 1 {
				t.Fatalf("the report's images: app %s, others %v; want one of audit's own", rep.Image, rep.Images)
			}
			target, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), rep.TargetPod, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, ct := range target.Spec.Containers {
				if want := map[string]string{"app": rep.Image, "audit": audit}[ct.Name]; ct.Image != want {
					t.Errorf("the target's container %s runs %s, want its checkpoint image %s", ct.Name, ct.Image, want)
				}
			}
			if target.Spec.NodeName != nodeB {
				t.Errorf("the target runs on %s, want %s", target.Spec.NodeName, nodeB)
			}
			sp := c.Nodes[nodeB].Pod(w.ns, target.Name)
			if sp == nil || !sp.Restored || len(sp.Apps) != 2 {
				t.Fatalf("node %s does not run the target restored with two apps: %+v", nodeB, sp)
			}
			checkApps(t, c, sp, inject.LogName(target), true)
			if _, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), w.pod.Name, metav1.GetOptions{}); w.pod.Name != target.Name && !apierrors.IsNotFound(err) {
				t.Errorf("the source %s is still there (err %v)", w.pod.Name, err)
			}
			for _, img := range []string{rep.Image, audit, migrate.CheckpointRef(c.ImageRepo(), w.ns, migrate.ContainerTag(p.Name, "audit"), c.SigningKey)} {
				expectNoImage(t, img)
			}
		})
	}

	w := deployWith(t, c, "sim-pod2-fail", "Deployment", twoContainerTemplate(), nil)
	t.Cleanup(func() { scaleToZero(t, c, w) })
	auditRef := func(p migrate.Plan) string {
		return migrate.CheckpointRef(c.ImageRepo(), w.ns, migrate.ContainerTag(p.Name, "audit"), c.SigningKey)
	}
	for _, tc := range []struct {
		name string
		arm  func(p migrate.Plan)
		want []string
	}{
		{"second checkpoint fails", func(migrate.Plan) {
			c.Nodes[nodeA].FailCheckpointOf("audit", simcluster.Failure{Code: http.StatusInternalServerError, Body: "CRIU: Can't dump ghost file"})
		}, []string{"container audit on node sim-a", "Can't dump ghost file", "the source was resumed and keeps serving"}},
		{"second push fails", func(p migrate.Plan) {
			ref := auditRef(p)
			c.FailPushesOf(ref[strings.LastIndex(ref, ":")+1:])
		}, []string{"app container audit", "the simulated registry refuses pushes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			defer resetNodes(c)
			p := plan(w, contract.StrategyMS2M)
			tc.arm(p)
			rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
			if err == nil {
				t.Fatal("the migration succeeded")
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v\nwant it to say %q", err, s)
				}
			}
			if _, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), p.TargetPod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("a target %s was made (err %v)", p.TargetPod, err)
			}
			sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
			if sp == nil {
				t.Fatal("node A does not run the source")
			}
			checkApps(t, c, sp, inject.LogName(w.pod), false)
			expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), w.ns, p.Name, c.SigningKey))
			expectNoImage(t, auditRef(p))
			if rep.Image != "" {
				t.Errorf("the report names image %s of a failed migration", rep.Image)
			}
		})
	}
}

// TestTwoContainerPodRebuilt: the second app container of a whole pod,
// migrated by the controller, restarts from its checkpoint image. The
// controller sees it (the app containers' restartCounts), stops the pod
// and restores it again, each container from its own image, and both
// apps end exact for their queues.
func TestTwoContainerPodRebuilt(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deployWith(t, c, "sim-pod2-rebuild", "Deployment", twoContainerTemplate(), nil)
	t.Cleanup(func() { scaleToZero(t, c, w) })
	startController(t, c, "the controller", c.Kubeconfig)
	requestMigration(t, c, w, contract.StrategyMS2M)
	served := waitServed(t, c, w)
	sp := c.Nodes[nodeB].Pod(w.ns, served.Name)
	before := sp.Apps["audit"].State()
	if err := c.Nodes[nodeB].RestartContainer(t.Context(), w.ns, served.Name, "audit"); err != nil {
		t.Fatal(err)
	}
	if after := sp.Apps["audit"].State(); after.Count >= before.Count {
		t.Fatalf("the restart did not take audit back to its checkpoint (%d processed before, %d after)", before.Count, after.Count)
	}
	expectEventOn(t, c, w.ns, served.Name, contract.ReasonStateRebuilt, "the state was rebuilt")
	name := migrate.RebuildPodName(served)
	var got *corev1.Pod
	testenv.Eventually(t, time.Minute, "the new restore "+name+" alone serves", func() bool {
		list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 || list.Items[0].Name != name || list.Items[0].Annotations[contract.AnnotationRestoredFrom] == "" {
			return false
		}
		got = &list.Items[0]
		return true
	})
	rp := c.Nodes[nodeB].Pod(w.ns, got.Name)
	if rp == nil || rp.UID != got.UID || !rp.Restored || len(rp.Apps) != 2 {
		t.Fatalf("node %s does not run the new restore %s with two apps", nodeB, name)
	}
	checkApps(t, c, rp, inject.LogName(got), true)
}

// checkApps checks that both apps of the whole pod sp serve on, each has
// processed every delivery of its queue once, and together all the
// log's (restored: they came back from their checkpoints).
func checkApps(t *testing.T, c *simcluster.Cluster, sp *simcluster.SimPod, log string, restored bool) {
	t.Helper()
	var last uint64
	for _, name := range []string{"app", "audit"} {
		app := sp.Apps[name]
		before := app.State().Last
		testenv.Eventually(t, 10*time.Second, name+" processes new deliveries", func() bool { return app.State().Last > before+4 })
		st := app.State()
		if len(st.Violations) > 0 {
			t.Errorf("%s saw deliveries out of order: %v", name, st.Violations)
		}
		// The app of part i of 2 takes IDs i+1, i+3, ...
		if want := app.WantCount(st.Last); st.Count != want {
			t.Errorf("%s processed %d deliveries, the last %d: want %d, each of its queue once", name, st.Count, st.Last, want)
		}
		if restored && st.Count <= 4 {
			t.Errorf("%s has processed %d deliveries: it did not come back from its checkpoint", name, st.Count)
		}
		last = max(last, st.Last)
	}
	if end := c.Log(log).LastID(); last+2 < end {
		t.Errorf("the apps' last delivery is %d, the log holds %d", last, end)
	}
}
