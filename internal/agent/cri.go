package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRIPuller pulls images through the node's CRI image service, the way the
// kubelet does: with the runtime's registry configuration, and recorded
// under every name the runtime gives an image (the name@digest that a
// restore looks its base image up by among them).
type CRIPuller struct {
	// Endpoint is the runtime's socket: unix:///run/containerd/containerd.sock
	// or unix:///var/run/crio/crio.sock.
	Endpoint string
	// Timeout bounds one pull. Default 5 minutes.
	Timeout time.Duration
}

// Pull pulls ref.
func (p CRIPuller) Pull(ctx context.Context, ref string) error {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target := p.Endpoint
	if !strings.Contains(target, "://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to the container runtime at %s: %w", p.Endpoint, err)
	}
	defer conn.Close()
	res, err := runtimeapi.NewImageServiceClient(conn).PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return fmt.Errorf("pull %s through the container runtime at %s: %w", ref, p.Endpoint, err)
	}
	if res.ImageRef == "" {
		return fmt.Errorf("pull %s: the runtime answered with no image", ref)
	}
	return nil
}
