package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
)

// ContainerdResumer resumes a paused container through containerd's own
// task API (containerd.services.tasks.v1.Tasks/Resume) on the runtime's
// socket, in the namespace the CRI plugin keeps Kubernetes' containers
// in. Resuming through the runtime, rather than by writing the freezer
// cgroup, keeps the runtime's idea of the task right: containerd's shim
// marks it running, and the resume containerd itself sends at the end
// of its checkpoint is refused and ignored. A thaw behind the runtime's
// back would leave the shim believing the task paused, refusing execs
// into it until it exits.
type ContainerdResumer struct {
	// Endpoint is containerd's socket: unix:///run/containerd/containerd.sock.
	Endpoint string
	// Namespace is containerd's namespace of the containers. Default
	// k8s.io, the CRI plugin's.
	Namespace string
	// Timeout bounds one resume (it waits while the shim finishes the
	// checkpoint). Default 30 s.
	Timeout time.Duration
}

// Resume resumes container id.
func (r ContainerdResumer) Resume(ctx context.Context, id string) error {
	ns, timeout := r.Namespace, r.Timeout
	if ns == "" {
		ns = "k8s.io"
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ns), timeout)
	defer cancel()
	target := r.Endpoint
	if !strings.Contains(target, "://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", r.Endpoint, err)
	}
	defer conn.Close()
	// ResumeTaskRequest{container_id = 1}; the answer is an Empty.
	req := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), id)
	var resp []byte
	if err := conn.Invoke(ctx, "/containerd.services.tasks.v1.Tasks/Resume", &req, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return fmt.Errorf("resume container %s through containerd at %s: %w", id, r.Endpoint, err)
	}
	return nil
}

// rawCodec sends and receives messages already encoded (*[]byte).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, errors.New("raw codec: want *[]byte")
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return errors.New("raw codec: want *[]byte")
	}
	*b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
