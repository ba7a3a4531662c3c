package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migratorcli"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestDrain: node 1 holds four consumers opted in by ms2m.io/on-evict
// (Go and Python, Deployment and StatefulSet) that are consuming.
// `migrator drain` of node 1 (cordon, evictions retried as kubectl drain
// does) ends with exit 0 and all four on node 2, the node kube-scheduler
// chose for their placeholders, each restored from its checkpoint (no pod
// restarted empty) and every hash exact. The suite's cluster has two
// nodes, so node 2 is the only place to go.
func TestDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 18*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	if l.External {
		t.Skip("drains node 1 of the suite's own cluster")
	}
	type consumer struct {
		kind  lab.Kind
		image string
		name  string
		src   *corev1.Pod
		prod  *lab.Producer
		pods  *podLog
	}
	cs := []*consumer{
		{kind: lab.Deployment, image: "consumer"},
		{kind: lab.Deployment, image: "consumer-python"},
		{kind: lab.StatefulSet, image: "consumer"},
		{kind: lab.StatefulSet, image: "consumer-python"},
	}
	node1, node2 := l.NodeName(1), l.NodeName(2)
	t.Cleanup(func() {
		patch := []byte(`{"spec":{"unschedulable":false}}`)
		if _, err := l.Client.CoreV1().Nodes().Patch(context.WithoutCancel(t.Context()), node1, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("uncordon %s: %v", node1, err)
		}
	})
	for _, c := range cs {
		if _, ok := l.Images[c.image]; !ok {
			testenv.Missing(t, "the "+c.image+" image (Debian's python3-pika on this host)", "run `make setup`, which installs python3-pika")
		}
		c.name = testenv.UniqueName("drain")
		c.pods = watchPods(t, ctx, l, c.name)
		src, err := l.StartWorkload(ctx, c.kind, lab.Consumer{Name: c.name, Queue: c.name, Node: node1, WorkMS: 50, Image: c.image,
			Mutate: func(p *corev1.Pod) { p.Annotations[contract.AnnotationOnEvict] = contract.OnEvictMigrate }})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
			defer cancel()
			logCleanup(t, "delete the workload", l.DeleteWorkload(ctx, c.kind, c.name))
			if c.src != nil {
				logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, testenv.RequireBroker(t).StreamURI, inject.LogName(c.src)))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		c.src = src
		// Long enough that every consumer still has deliveries when it
		// migrates: the drain moves consumers under load.
		c.prod = produce(t, src, c.name, 10, 1500, 20)
	}

	var out bytes.Buffer
	start := time.Now()
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.name)
	}
	// Only this test's pods: whatever else runs on node 1 is not its to evict.
	sel := "app in (" + strings.Join(names, ",") + ")"
	code := migratorcli.Main(ctx, []string{"drain", "-kubeconfig", l.Kubeconfig, "-timeout", "10m", "-pod-selector", sel, node1}, &out, &out)
	t.Logf("migrator drain %s (%s):\n%s", node1, time.Since(start).Round(time.Second), out.String())
	if code != 0 {
		t.Errorf("migrator drain exited %d, want 0", code)
	}
	for _, c := range cs {
		list, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + c.name})
		if err != nil || len(list.Items) != 1 {
			t.Errorf("%s %s: %d pods (%v), want 1", c.kind, c.name, len(list.Items), err)
			continue
		}
		target := &list.Items[0]
		st := migrationStatus(t, target)
		t.Logf("%s/%s: %s by %s, %s", c.kind, c.image, target.Name, st.Strategy, st.Message)
		if target.UID == c.src.UID || target.Spec.NodeName != node2 || st.Phase != contract.PhaseSucceeded || st.Evacuation != node1 {
			t.Errorf("%s %s: %s on %s, status %s evacuation %q; want a restore on %s by an evacuation off %s", c.kind, c.name, target.Name, target.Spec.NodeName, st.Phase, st.Evacuation, node2, node1)
			continue
		}
		expectExact(t, ctx, c.prod, target)
		expectNoEmptyReplica(t, c.pods, c.src.UID, map[lab.Kind]int{lab.Deployment: 2, lab.StatefulSet: 3}[c.kind])
	}
	list, err := l.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: contract.LabelPlaceholderFor})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("placeholders left: %d (%v)", len(list.Items), err)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("%d migrated", len(cs))) {
		t.Errorf("the drain's summary does not count %d migrated", len(cs))
	}
}
