package migratorcli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
)

const fromAnnotation = "annotation " + contract.AnnotationMigrationStatus

func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	namespace := fs.String("namespace", "default", "the namespace to list")
	all := fs.Bool("A", false, "list every namespace")
	output := fs.String("o", "table", "table or json")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "migrator status: -o %q: want table or json\n", *output)
		return 2
	}
	if len(positional) > 1 {
		fmt.Fprintln(stderr, "migrator status: want at most one <namespace>/<pod>")
		return 2
	}
	cs, err := kubeClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "migrator status: %v\n", err)
		return 1
	}
	now := time.Now()
	if len(positional) == 1 {
		ns, pod, err := splitPod(positional[0])
		if err != nil {
			fmt.Fprintf(stderr, "migrator status: %v\n", err)
			return 2
		}
		rec, err := podRecord(ctx, cs, ns, pod)
		if err != nil {
			fmt.Fprintf(stderr, "migrator status: %v\n", err)
			return 1
		}
		if *output == "json" {
			return writeJSON(stdout, stderr, toJSON(rec))
		}
		if err := writeDetail(stdout, rec, now); err != nil {
			return 1
		}
		return 0
	}
	if *all {
		*namespace = metav1.NamespaceAll
	}
	recs, err := listRecords(ctx, cs, *namespace)
	if err != nil {
		fmt.Fprintf(stderr, "migrator status: %v\n", err)
		return 1
	}
	if *output == "json" {
		out := make([]recordJSON, len(recs))
		for i, r := range recs {
			out[i] = toJSON(r)
		}
		return writeJSON(stdout, stderr, out)
	}
	if len(recs) == 0 {
		fmt.Fprintf(stderr, "no migrations recorded (no pod carries %s)\n", contract.AnnotationMigrationStatus)
		return 0
	}
	if writeTable(stdout, recs, now) != nil {
		return 1
	}
	return 0
}

func writeJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "migrator status: %v\n", err)
		return 1
	}
	return 0
}

// podRecord reads the migration status of pod ns/name.
func podRecord(ctx context.Context, cs kubernetes.Interface, ns, name string) (record, error) {
	p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return record{}, fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	rec, ok := recordOf(p)
	if !ok {
		return record{}, fmt.Errorf("pod %s/%s has no migration status (annotation %s): ask for one with %s: <node>, or run migrator migrate", ns, name, contract.AnnotationMigrationStatus, contract.AnnotationMigrateTo)
	}
	if rec.Err != nil {
		return rec, rec.Err
	}
	return rec, nil
}

// listRecords returns the migrations recorded on the pods of ns (every
// namespace for ""), sorted.
func listRecords(ctx context.Context, cs kubernetes.Interface, ns string) ([]record, error) {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	var recs []record
	for i := range pods.Items {
		if rec, ok := recordOf(&pods.Items[i]); ok {
			recs = append(recs, rec)
		}
	}
	sortRecords(recs)
	return recs, nil
}

// recordOf is the migration status pod carries, if any.
func recordOf(p *corev1.Pod) (record, bool) {
	v, ok := p.Annotations[contract.AnnotationMigrationStatus]
	if !ok {
		return record{}, false
	}
	rec := record{Namespace: p.Namespace, Pod: p.Name, From: fromAnnotation}
	st, err := controller.DecodeStatus(v)
	if err != nil {
		rec.Err = fmt.Errorf("pod %s/%s, %s: %w; fix or remove the annotation", p.Namespace, p.Name, fromAnnotation, err)
	}
	rec.Status = st
	return rec, true
}

// kubeClient is a client from the kubeconfig file, or in-cluster for "".
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}
