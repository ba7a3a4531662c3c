package e2e

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestMixedRuntimesRefused: on a cluster whose nodes run containerd and
// CRI-O (MS2M_E2E_RUNTIME=crio,crio,containerd, make test's second e2e
// run), a migration of the sample consumer from the containerd node to a
// CRI-O node (by `migrator migrate`) and back (by the controller, from
// ms2m.io/migrate-to) is refused before anything is done: the error and
// the Migration status name both nodes, both runtimes and the target to
// pick. Both sources keep their pods and keep consuming, exact; no
// checkpoint archive, checkpoint image or target pod is made.
func TestMixedRuntimesRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	l := needLab(t, "it needs nodes that run different container runtimes")
	cd, crio := nodeOn(l, cluster.RuntimeContainerd), nodeOn(l, cluster.RuntimeCRIO)
	if cd == 0 || crio == 0 {
		t.Skipf("the suite's nodes all run %s: the test needs a containerd node and a CRI-O node (MS2M_E2E_RUNTIME=crio,crio,containerd, as make test's second e2e run)", l.Cluster.Runtime())
	}
	l, agents := needMS2MAgents(t, ctx, withControllerAndAgents)
	if agents == nil {
		t.Fatal("no node agents: the preflight has nothing to ask")
	}
	cdNode, crioNode := l.NodeName(cd), l.NodeName(crio)
	migrator := migratorWithAgents(t, ctx, l)

	// One consumer on each node, each on its own queue, each being fed.
	type source struct {
		pod  *corev1.Pod
		prod *lab.Producer
	}
	start := func(node string) source {
		name := testenv.UniqueName("mixed")
		pod, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: node, WorkMS: 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name) })
		return source{pod, produce(t, pod, name, 20, 1000, 20)}
	}
	onCD, onCRIO := start(cdNode), start(crioNode)
	// Both runtimes named as the agents report them, each with a version.
	wantRuntimes := []string{"containerd v2.", "cri-o 1."}

	// containerd → CRI-O, by the CLI.
	out, errOut, err := migrator("migrate", lab.Namespace+"/"+onCD.pod.Name, "--to", crioNode, "--image-repo", imageRepo(l), "--kubeconfig", l.Kubeconfig)
	if err == nil {
		t.Fatalf("migrator migrate from %s (containerd) to %s (CRI-O) succeeded:\n%s", cdNode, crioNode, out)
	}
	t.Logf("migrator migrate %s → %s refused: %s", cdNode, crioNode, strings.TrimSpace(errOut))
	for _, want := range append([]string{"source node " + cdNode + " runs containerd", "target node " + crioNode + " runs cri-o", "pick a target that runs containerd"}, wantRuntimes...) {
		if !strings.Contains(errOut, want) {
			t.Errorf("migrator migrate's error %q lacks %q", errOut, want)
		}
	}
	for _, phase := range []string{"quiesce", "checkpoint", "prepare target"} {
		if strings.Contains(out, phase) {
			t.Errorf("the refused migration ran %s:\n%s", phase, out)
		}
	}

	// CRI-O → containerd, by the controller.
	annotate(t, ctx, l, onCRIO.pod.Name, map[string]any{contract.AnnotationMigrateTo: cdNode})
	testenv.Eventually(t, time.Minute, "the controller answers the request to "+cdNode, func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, onCRIO.pod.Name, metav1.GetOptions{})
		return err == nil && migrationStatus(t, p).Phase == contract.PhaseFailed
	})
	p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, onCRIO.pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := migrationStatus(t, p)
	t.Logf("the controller's status for %s → %s: %s", crioNode, cdNode, st.Message)
	for _, want := range append([]string{"source node " + crioNode + " runs cri-o", "target node " + cdNode + " runs containerd", "pick a target that runs cri-o", "nothing was touched"}, wantRuntimes...) {
		if !strings.Contains(st.Message, want) {
			t.Errorf("the migration status %q lacks %q", st.Message, want)
		}
	}
	waitEventSaying(t, ctx, l, onCRIO.pod, contract.ReasonMigrationNodeNotCapable, "runs containerd")

	// Nothing was done: the same pods consume on, exact to the end.
	counts := map[string]int{}
	for _, s := range []source{onCD, onCRIO} {
		st, err := lab.GetAppState(s.pod)
		if err != nil {
			t.Fatalf("the consumer in %s after the refusals: %v", s.pod.Name, err)
		}
		counts[s.pod.Name] = st.Count
	}
	for _, s := range []source{onCD, onCRIO} {
		before := counts[s.pod.Name]
		expectExact(t, ctx, s.prod, s.pod)
		after, _ := lab.GetAppState(s.pod)
		t.Logf("the source %s on %s consumed on: count %d after the refusals, %d at the end, hash %.12s", s.pod.Name, s.pod.Spec.NodeName, before, after.Count, after.Hash)
		if after.Count <= before {
			t.Errorf("the consumer in %s stopped at %d after the refusals (count %d at the end)", s.pod.Name, before, after.Count)
		}
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, s.pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != s.pod.UID || p.Status.Phase != corev1.PodRunning || restarts(p) != 0 {
			t.Errorf("the source %s after the refusals: %v, %+v", s.pod.Name, err, p.Status)
		}
		archives, _ := filepath.Glob(filepath.Join(l.Cluster.Node(nodeIndex(l, s.pod.Spec.NodeName)).CheckpointDir, "checkpoint-"+s.pod.Name+"_*"))
		if len(archives) != 0 {
			t.Errorf("the source %s was checkpointed: %v", s.pod.Name, archives)
		}
	}
	pods, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, s := range []source{onCD, onCRIO} {
			if p.Name != s.pod.Name && strings.HasPrefix(p.Name, s.pod.Name) {
				t.Errorf("a pod %s on %s was made for the refused migration of %s", p.Name, p.Spec.NodeName, s.pod.Name)
			}
		}
	}
	tags, err := registryTags(ctx, l.Registry, strings.TrimPrefix(imageRepo(l), l.Registry+"/")+"/"+lab.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range tags {
		for _, s := range []source{onCD, onCRIO} {
			if strings.HasPrefix(tag, s.pod.Name) {
				t.Errorf("a checkpoint image %s was pushed for the refused migration of %s", tag, s.pod.Name)
			}
		}
	}
}

// TestCrossRuntimeRestore asks whether a restore across runtimes works:
// ms2m of the Go consumer from the containerd node to a CRI-O node and
// back, by migrate.Run with the lab's host-side agent, which has no
// preflight. It is the check to run again before the preflight lets such
// a pair through (docs/runtimes.md), so it runs only with
// MS2M_E2E_CROSS_RUNTIME=1 on a mixed cluster. On containerd 2.3.7 and
// CRI-O 1.34.0 both directions fail at the target's CreateContainer, the
// source resumed: each runtime reads its own files of the archive (CRI-O
// its annotations in config.dump, containerd status.dump).
func TestCrossRuntimeRestore(t *testing.T) {
	if os.Getenv("MS2M_E2E_CROSS_RUNTIME") == "" {
		t.Skip("a check of what the runtimes do, not of ms2m: run with MS2M_E2E_CROSS_RUNTIME=1 on a mixed cluster (MS2M_E2E_RUNTIME=crio,crio,containerd)")
	}
	l := needLab(t, "it runs migrate.Run in the test process")
	cd, crio := nodeOn(l, cluster.RuntimeContainerd), nodeOn(l, cluster.RuntimeCRIO)
	if cd == 0 || crio == 0 {
		t.Fatalf("MS2M_E2E_CROSS_RUNTIME needs a containerd node and a CRI-O node; the suite's run %s", l.Cluster.Runtime())
	}
	for _, pair := range [][2]int{{cd, crio}, {crio, cd}} {
		from, to := l.Cluster.Node(pair[0]), l.Cluster.Node(pair[1])
		t.Run(from.Runtime+"-to-"+to.Runtime, func(t *testing.T) {
			migrateWhileProducing(t, l, scenario{strategy: contract.StrategyMS2M, image: "consumer", n: 120, rate: 10, workMS: 50, from: from.Name, to: to.Name})
		})
	}
}

// nodeOn is the first of the lab's nodes that runs runtime (1-based), or 0.
func nodeOn(l *lab.Lab, runtime string) int {
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		if l.Cluster.Node(i).Runtime == runtime {
			return i
		}
	}
	return 0
}

// nodeIndex is the number of the lab's node named name, or 0.
func nodeIndex(l *lab.Lab, name string) int {
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		if l.NodeName(i) == name {
			return i
		}
	}
	return 0
}

// registryTags lists the tags of repo in the plain-HTTP registry at
// addr; a repository the registry does not know has none.
func registryTags(ctx context.Context, addr, repo string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/v2/%s/tags/list", addr, repo), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list the tags of %s at %s: %s", repo, addr, resp.Status)
	}
	var list struct {
		Tags []string `json:"tags"`
	}
	return list.Tags, json.NewDecoder(resp.Body).Decode(&list)
}
