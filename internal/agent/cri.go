package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/ms2m/ms2m/internal/contract"
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

// Pull pulls ref, with auth when it is not nil (the runtime's own
// registry configuration otherwise), as the kubelet passes a pod's
// imagePullSecrets.
func (p CRIPuller) Pull(ctx context.Context, ref string, auth *contract.RegistryAuth) error {
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
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}
	if auth != nil {
		req.Auth = &runtimeapi.AuthConfig{Username: auth.Username, Password: auth.Password,
			IdentityToken: auth.IdentityToken, RegistryToken: auth.RegistryToken, ServerAddress: serverAddress(auth.Registry)}
	}
	res, err := runtimeapi.NewImageServiceClient(conn).PullImage(ctx, req)
	if err != nil {
		return fmt.Errorf("pull %s through the container runtime at %s: %w", ref, p.Endpoint, err)
	}
	if res.ImageRef == "" {
		return fmt.Errorf("pull %s: the runtime answered with no image", ref)
	}
	return nil
}

// serverAddress is the CRI AuthConfig's server address for registry
// (host[:port]): a URL, whose host containerd compares with each host it
// sends the credentials to, so that they go to that registry and not to
// a mirror. Docker Hub's is left empty: containerd reaches it under
// another host name than the one images are named by.
func serverAddress(registry string) string {
	switch registry {
	case "", "docker.io", "index.docker.io":
		return ""
	}
	return "https://" + registry
}
