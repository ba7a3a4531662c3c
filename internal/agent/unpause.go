package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A checkpoint that fails can leave the app paused. containerd pauses the
// task for its whole checkpoint and resumes it with the request's context
// (client/task.go, "defer t.Resume(ctx)"; the same in 2.2.9 and 2.3.7,
// whose CRI checkpoint still hands it the kubelet's context): when the
// kubelet's call is cancelled (the agent that asked died, or the kubelet's
// timeout fired), that resume fails and the container stays frozen while
// its pod looks Running, so the migrator's rollback resumes the sidecar
// into an app that never runs again. CRIU itself, when runc runs it and it
// is killed mid-dump, leaves the container's freezer cgroup FROZEN while
// the runtime holds the task running. So the agent resumes the container
// itself, only if its cgroup is frozen and no tracer (CRIU) holds its
// tasks any more: after a checkpoint call that failed, and, for the
// checkpoints a previous agent process left unanswered in the journal,
// when it starts (SweepArchives).

// Located is one running container: its ID and its pod's UID.
type Located struct {
	PodUID, ID string
}

// Locator finds the running containers named container of pod ns/pod on
// the node.
type Locator interface {
	Locate(ctx context.Context, ns, pod, container string) ([]Located, error)
}

// CRILocator finds containers through the node's CRI runtime service by
// the labels the kubelet gives every container.
type CRILocator struct {
	Endpoint string        // the runtime's socket
	Timeout  time.Duration // default 10 s
}

// Locate lists the running containers of ns/pod named container.
func (l CRILocator) Locate(ctx context.Context, ns, pod, container string) ([]Located, error) {
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target := l.Endpoint
	if !strings.Contains(target, "://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to the container runtime at %s: %w", l.Endpoint, err)
	}
	defer conn.Close()
	res, err := runtimeapi.NewRuntimeServiceClient(conn).ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{
			"io.kubernetes.pod.namespace":  ns,
			"io.kubernetes.pod.name":       pod,
			"io.kubernetes.container.name": container,
		},
	}})
	if err != nil {
		return nil, fmt.Errorf("list the containers of %s/%s through the container runtime at %s: %w", ns, pod, l.Endpoint, err)
	}
	var out []Located
	for _, c := range res.Containers {
		out = append(out, Located{PodUID: c.Labels["io.kubernetes.pod.uid"], ID: c.Id})
	}
	return out, nil
}

// unpauseWait bounds how long unpause waits for a CRIU that still dumps.
const unpauseWait = 2 * time.Minute

// errCannotUnpause: the agent has no runtime to find or resume containers
// with.
var errCannotUnpause = errors.New("the agent has no container runtime to resume a paused container with (MS2M_AGENT_RUNTIME_ENDPOINT)")

// unpause resumes each running container named container of ns/pod that
// its cgroup's freezer holds, and returns how it resumed each (container
// ID: "runtime" or "cgroup"). While CRIU still traces the tasks it waits
// (CRIU thaws what it froze when its dump ends), until ctx ends. A frozen
// container is resumed through the runtime; if the runtime refuses (it
// holds the task running: the freeze is that of a CRIU that died
// mid-dump, which runc set through the freezer and nobody thaws), the
// cgroup's freezer is thawed directly, which puts the node back where the
// runtime believes it is.
func (s *Server) unpause(ctx context.Context, ns, pod, container string) (map[string]string, error) {
	if s.cfg.Locator == nil || s.cfg.Freeze.Runtime == nil {
		return nil, errCannotUnpause
	}
	found, err := s.cfg.Locator.Locate(ctx, ns, pod, container)
	if err != nil {
		return nil, err
	}
	resumed := map[string]string{}
	var errs []error
	for _, c := range found {
		how, err := s.unpauseOne(ctx, c)
		if how != "" {
			resumed[c.ID] = how
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return resumed, errors.Join(errs...)
}

// unpauseOne is unpause for one container.
func (s *Server) unpauseOne(ctx context.Context, c Located) (how string, err error) {
	w := s.cfg.Freeze
	dir, err := w.FindCgroup(c.PodUID, c.ID)
	if err != nil {
		return "", err
	}
	_, _, poll := w.roots()
	tick := time.NewTicker(max(poll, 100*time.Millisecond))
	defer tick.Stop()
	for {
		frozen, file := frozenNow(dir)
		if !frozen {
			return "", nil
		}
		tr, err := w.traceOf(dir)
		if err != nil {
			return "", err
		}
		if !tr.traced {
			rerr := w.Runtime.Resume(ctx, c.ID)
			if rerr == nil {
				return "runtime", nil
			}
			if still, _ := frozenNow(dir); !still {
				return "runtime", nil
			}
			if terr := thawCgroup(dir, file); terr != nil {
				return "", fmt.Errorf("container %s stays frozen: the runtime did not resume it (%w) and its cgroup could not be thawed: %w", c.ID, rerr, terr)
			}
			return "cgroup", nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("container %s: still frozen and traced (CRIU dumping it) when the wait ended: %w", c.ID, ctx.Err())
		case <-tick.C:
		}
	}
}

// thawCgroup thaws cgroup dir's freezer through file (frozenNow's).
func thawCgroup(dir, file string) error {
	v := "THAWED"
	if file == "cgroup.freeze" {
		v = "0"
	}
	return os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644)
}

// unpauseAfter runs unpause for a checkpoint of ns/pod's container that
// ended without an archive (why), and logs what it did.
func (s *Server) unpauseAfter(ns, pod, container, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), unpauseWait)
	defer cancel()
	resumed, err := s.unpause(ctx, ns, pod, container)
	for id, how := range resumed {
		s.log.Warn("resumed a container left frozen by a checkpoint that did not finish", "namespace", ns, "pod", pod, "container", container, "id", id, "through", how, "checkpoint", why)
	}
	if err != nil && !errors.Is(err, errCannotUnpause) {
		s.log.Warn("could not check whether a checkpoint that did not finish left its container paused; if the app does not run, resume it with the runtime (crictl or ctr)", "namespace", ns, "pod", pod, "container", container, "checkpoint", why, "err", err)
	}
}
