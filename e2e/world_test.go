package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The lab (cluster, images, Secret) is made once per test binary and taken
// down by TestMain, unless MS2M_E2E_KEEP is set.
var (
	labOnce sync.Once
	theLab  *lab.Lab
	labErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if theLab != nil && os.Getenv("MS2M_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "e2e: MS2M_E2E_KEEP is set: the cluster stays up (kubeconfig %s); take it down with: go run ./hack/cluster down -state %s\n", theLab.Cluster.Kubeconfig(), theLab.Opts.StateDir)
	} else if theLab != nil {
		if err := theLab.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cluster down: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needLab returns the shared lab, bringing it up on first use.
func needLab(t *testing.T) *lab.Lab {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	testenv.WatchdogFor(t, 15*time.Minute)
	testenv.RequireBroker(t)
	labOnce.Do(func() {
		root := testenv.ModuleRoot(t)
		opts := cluster.Options{
			Nodes:          2,
			StateDir:       envOr("MS2M_E2E_STATE", "/var/tmp/ms2m-e2e"),
			RepoDir:        root,
			BinDir:         filepath.Join(root, "bin"),
			Log:            os.Stderr,
			WaitForNetwork: true,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		var l *lab.Lab
		l, labErr = lab.Start(ctx, opts)
		if l != nil && l.Cluster != nil {
			theLab = l
		} else if labErr != nil {
			cluster.Down(opts) // whatever a failed up left
		}
	})
	var pe *cluster.PreconditionError
	if errors.As(labErr, &pe) {
		testenv.Missing(t, "what a real cluster needs: "+labErr.Error(), "the fix under each item above; `make node-bin criu node-setup` covers most")
	}
	if labErr != nil {
		t.Fatalf("bring up the lab: %v", labErr)
	}
	return theLab
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// produce runs the sample producer on the host (n messages to queue at rate
// per second; stopped when the test ends) and waits until the consumer in
// src has folded its first folds of them, so that a migration starts on a
// consumer with state.
func produce(t *testing.T, src *corev1.Pod, queue string, rate float64, n, folds int) *lab.Producer {
	t.Helper()
	prod, err := lab.StartProducer(testenv.Build(t, "examples/producer"), queue, rate, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Stop)
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the source consumer folds its first %d messages", folds), func() bool {
		st, err := lab.GetAppState(src)
		return err == nil && st.Count >= folds
	})
	return prod
}

// expectExact waits for the producer to finish and for pod's consumer to
// settle, and fails the test unless its count and hash are the producer's.
func expectExact(t *testing.T, ctx context.Context, prod *lab.Producer, pod *corev1.Pod) {
	t.Helper()
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(pod, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash {
		t.Errorf("restored consumer: count %d hash %s; producer: count %d hash %s", got.Count, got.Hash, want.Count, want.Hash)
	}
}
