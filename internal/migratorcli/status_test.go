package migratorcli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ms2m/ms2m/internal/contract"
)

func statusPod(ns, name, status string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if status != "" {
		p.Annotations = map[string]string{contract.AnnotationMigrationStatus: status}
	}
	return p
}

// TestStatusListsAndShows: the table lists every pod with a migration
// status, a bad annotation shows as such, and one pod's detail has its
// phases; a pod without a status says how to get one.
func TestStatusListsAndShows(t *testing.T) {
	ok := `{"name":"web-0-abc","phase":"Succeeded","strategy":"statefulset-shadow","target":"node-2","targetPod":"web-0","started":"2026-12-03T08:00:00Z",` +
		`"report":{"strategy":"statefulset-shadow","total":10000000000,"downtime":8000000,"checkpointId":22,"cutoffId":120,"phases":[{"name":"preconditions","took":5000000},{"name":"handover","took":2000000000}],"archive":"","image":"r/c@sha256:1","targetPod":"web-0"},` +
		`"history":[{"name":"web-0-abc","outcome":"Succeeded","from":"node-1","to":"node-2","started":"2026-12-03T08:00:00Z","total":10000000000,"downtime":8000000},` +
		`{"outcome":"Failed","from":"node-1","to":"no-such-node","started":"2026-12-03T07:59:00Z"},` +
		`{"name":"web-0-abb","outcome":"Succeeded","from":"node-2","to":"node-1","started":"2026-12-03T07:00:00Z","total":9000000000,"downtime":7000000}]}`
	cs := fake.NewClientset(
		statusPod("shop", "web-0", ok),
		statusPod("shop", "broken", "{"),
		statusPod("shop", "plain", ""),
		statusPod("other", "elsewhere", ok),
	)
	ctx := t.Context()
	recs, err := listRecords(ctx, cs, "shop")
	if err != nil || len(recs) != 2 {
		t.Fatalf("listRecords = %d records, %v; want 2", len(recs), err)
	}
	var out bytes.Buffer
	if err := writeTable(&out, recs, time.Date(2026, 12, 3, 8, 1, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"web-0-abc", "statefulset-shadow", "Succeeded", "node-2", "8ms", "broken", "ok,failed,ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if all, _ := listRecords(ctx, cs, ""); len(all) != 3 {
		t.Errorf("all namespaces: %d records, want 3", len(all))
	}

	rec, err := podRecord(ctx, cs, "shop", "web-0")
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := writeDetail(&out, rec, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"preconditions", "handover", "r/c@sha256:1", "120", "history", "web-0-abb", "node-2  node-1", "no-such-node", "7ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("detail lacks %q:\n%s", want, out.String())
		}
	}

	for name, wantErr := range map[string]string{
		"plain":   "has no migration status",
		"broken":  "fix or remove the annotation",
		"missing": "not found",
	} {
		if _, err := podRecord(ctx, cs, "shop", name); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("podRecord(%s) error %v, want one saying %q", name, err, wantErr)
		}
	}
}
