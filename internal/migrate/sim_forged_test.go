package migrate_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/migrate"
)

// TestForgedMigrationStatusIgnored performs the confused-deputy attack of
// issue 20 as a tenant would: on its own pod it writes a Running
// ms2m.io/migration-status naming another namespace's migration (whose
// checkpoint image is in the registry) and a target pod of that namespace,
// with a request for the node the pod runs on so that the controller looks.
// The controller must ignore the record it did not sign, with a Warning
// Event ForgedMigrationStatus: no rollback, the image stays. On the old
// behaviour the controller "rolled back" the forged migration and deleted
// the image by the forged name.
func TestForgedMigrationStatusIgnored(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	victim := deploy(t, c, "sim-forged-victim", "Deployment", true)
	tenant := deploy(t, c, "sim-forged-tenant", "Deployment", true)
	// It keeps images once the target serves, so that the victim's is there
	// to be deleted by a forged name.
	startController(t, c, "the controller", c.Kubeconfig, "MS2M_KEEP_CHECKPOINT_IMAGES=true")

	// The victim's real migration leaves its checkpoint image.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationMigrateTo, nodeB)
	if _, err := c.Client.CoreV1().Pods(victim.ns).Patch(ctx, victim.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	moved := waitMigrated(t, c, victim.ns, victim.pod, nodeB, "")
	vst, _ := controller.DecodeStatus(moved.Annotations[contract.AnnotationMigrationStatus])
	ref := migrate.CheckpointRef(c.ImageRepo(), victim.ns, vst.Name, c.SigningKey)
	imageThere := func() error {
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			return err
		}
		_, err = remote.Head(r)
		return err
	}
	if err := imageThere(); err != nil {
		t.Fatalf("the victim's checkpoint image %s after its migration (MS2M_KEEP_CHECKPOINT_IMAGES=true): %v", ref, err)
	}
	checkImage(t, moved.Spec.Containers[0].Image, "app")

	// The tenant forges a Running record of the victim's migration.
	forged, _ := json.Marshal(controller.Status{
		Name: vst.Name, Phase: contract.PhaseRunning, Strategy: string(contract.StrategyMS2M),
		Source: tenant.pod.Spec.NodeName, Target: nodeB, TargetPod: moved.Name, Started: time.Now(),
	})
	patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q,%q:"forged"}}}`,
		contract.AnnotationMigrationStatus, string(forged), contract.AnnotationMigrateTo, tenant.pod.Spec.NodeName,
		contract.AnnotationMigrationStatusSignature)
	if _, err := c.Client.CoreV1().Pods(tenant.ns).Patch(ctx, tenant.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	expectEventOn(t, c, tenant.ns, tenant.pod.Name, contract.ReasonForgedMigrationStatus, "not signed")
	st := waitAnswered(t, c, tenant.ns, tenant.pod.Name, string(forged))
	if st.Phase != contract.PhaseFailed || st.Name == vst.Name {
		t.Errorf("the tenant's status after the forgery: %s %s %q, want its own request's answer (Failed: already runs there)", st.Name, st.Phase, st.Message)
	}
	if len(st.History) != 1 {
		t.Errorf("the tenant's history %+v: want only its own request (the forged record's history is dropped)", st.History)
	}
	if err := imageThere(); err != nil {
		t.Errorf("the victim's checkpoint image %s after the forged status: %v; want it kept", ref, err)
	}
	if p, err := c.Client.CoreV1().Pods(victim.ns).Get(ctx, moved.Name, metav1.GetOptions{}); err != nil || p.UID != moved.UID {
		t.Errorf("the victim's pod %s after the forged status: %v", moved.Name, err)
	}
	expectServing(t, c, tenant)
	evs, err := c.Client.EventsV1().Events(tenant.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == contract.ReasonMigrationRolledBack || e.Reason == contract.ReasonMigrationRollbackFailed {
			t.Errorf("Event %s: %s; want no rollback of a forged record", e.Reason, e.Note)
		}
	}
}
