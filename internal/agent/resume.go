package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
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

// OCIResumer resumes a container through its OCI runtime's own resume
// command: `<Path> [--root <Root>] resume <id>` (runc and crun take the
// same), as CRI-O runs them. CRI-O pauses the container with the
// runtime's pause before its checkpoint and, when the checkpoint call
// ends, unpauses it only if the runtime still reports it paused
// (internal/lib/checkpoint.go, v1.34), so a resume through the same
// runtime and state root leaves CRI-O's idea of the container right and
// its own unpause skipped. The runtime keeps no paused flag of its own:
// it reads the freezer, which its resume thaws.
type OCIResumer struct {
	// Path is the runtime's binary (CRI-O's runtime_path), as the agent
	// sees it; a bare name is looked up in PATH.
	Path string
	// Root is the runtime's state folder (CRI-O's runtime_root); ""
	// leaves the runtime's default.
	Root string
	// Timeout bounds one resume. Default 30 s.
	Timeout time.Duration
}

// Args are the runtime's arguments that resume container id.
func (r OCIResumer) Args(id string) []string {
	var args []string
	if r.Root != "" {
		args = append(args, "--root", r.Root)
	}
	return append(args, "resume", id)
}

// Resume resumes container id.
func (r OCIResumer) Resume(ctx context.Context, id string) error {
	if id == "" || strings.HasPrefix(id, "-") || strings.ContainsAny(id, "/. \t\n") {
		return fmt.Errorf("container ID %q: want a runtime's container ID", id)
	}
	if r.Path == "" {
		return errors.New("no OCI runtime to resume the container through")
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.Path, r.Args(id)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", r.Path, strings.Join(r.Args(id), " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// CRI-O's defaults for a runtime it is not told about (pkg/config,
// config_linux.go, v1.34): crun, in /run/crun.
const (
	crioDefaultRuntime     = "crun"
	crioDefaultRuntimeRoot = "/run/crun"
)

// CRIOResumer is the resumer of CRI-O's default runtime as its
// configuration texts (crio.conf and its drop-ins, later ones winning)
// set it: [crio.runtime] default_runtime names a
// [crio.runtime.runtimes.<name>] table whose runtime_path and
// runtime_root are the binary and its state root. A table without
// runtime_path leaves the binary to PATH, by the runtime's name, and
// one without runtime_root the runtime's own default, as CRI-O does; a
// default runtime without a table is CRI-O's built-in crun. Only an
// "oci" runtime_type runs runc's commands; a VM or pod runtime has no
// resume the agent can call.
func CRIOResumer(texts []string) (OCIResumer, error) {
	kv := mergeTOMLish(texts)
	name := kv["crio.runtime.default_runtime"]
	if name == "" {
		name = crioDefaultRuntime
	}
	table := "crio.runtime.runtimes." + name + "."
	known := false
	for k := range kv {
		if strings.HasPrefix(k, table) {
			known = true
			break
		}
	}
	if !known {
		if name != crioDefaultRuntime {
			return OCIResumer{}, fmt.Errorf("CRI-O's default_runtime %q has no [crio.runtime.runtimes.%s] table in its configuration", name, name)
		}
		return OCIResumer{Path: name, Root: crioDefaultRuntimeRoot}, nil
	}
	if typ := kv[table+"runtime_type"]; typ != "" && typ != "oci" {
		return OCIResumer{}, fmt.Errorf("CRI-O's default runtime %q is of runtime_type %q: only an oci runtime has a resume command", name, typ)
	}
	path := kv[table+"runtime_path"]
	if path == "" {
		path = name
	}
	return OCIResumer{Path: path, Root: kv[table+"runtime_root"]}, nil
}

// NodeResumer resumes containers through the node's runtime, whichever
// it is: containerd's task API (ContainerdResumer) on a containerd node,
// the OCI runtime's resume (OCIResumer, from CRI-O's configuration) on a
// CRI-O node. It asks the runtime at Endpoint its name (CRI Version) at
// the first resume, or, if it does not answer, takes it from the
// configuration's keys, and keeps what it found.
type NodeResumer struct {
	// Endpoint is the runtime's CRI socket.
	Endpoint string
	// Config are the runtime's configuration files as the agent sees
	// them (MS2M_AGENT_RUNTIME_CONFIG); CRI-O's say where its runtime is.
	Config []string

	mu      sync.Mutex
	resumer Resumer
}

// Resume resumes container id through the node's runtime.
func (r *NodeResumer) Resume(ctx context.Context, id string) error {
	res, err := r.runtime(ctx)
	if err != nil {
		return err
	}
	return res.Resume(ctx, id)
}

// Prepare finds the node's runtime now, so that the first thaw does not
// wait for it: CRI-O ends its checkpoint call some 10-30 ms after CRIU's
// dump, and a thaw that comes later is no thaw. An error (the runtime
// not up yet) leaves it to the first resume.
func (r *NodeResumer) Prepare(ctx context.Context) error {
	_, err := r.runtime(ctx)
	return err
}

// runtime finds the node's runtime's resumer, once it is known.
func (r *NodeResumer) runtime(ctx context.Context) (Resumer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resumer != nil {
		return r.resumer, nil
	}
	var texts []string
	for _, f := range r.Config {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // a drop-in that is not there
		}
		if err != nil {
			return nil, fmt.Errorf("runtime config %s: %w", f, err)
		}
		texts = append(texts, string(b))
	}
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	name, _, verr := criVersion(vctx, r.Endpoint)
	cancel()
	res, err := resumerFor(normalRuntime(name), r.Endpoint, texts)
	if err != nil {
		if verr != nil {
			return nil, fmt.Errorf("%w (%v)", err, verr)
		}
		return nil, err
	}
	r.resumer = res
	return res, nil
}

// resumerFor is the resumer of runtime (containerd, cri-o; "" if the
// runtime did not say: its configuration's keys tell) at endpoint.
func resumerFor(runtime, endpoint string, texts []string) (Resumer, error) {
	if runtime == "" {
		runtime = configRuntime(mergeTOMLish(texts))
	}
	switch runtime {
	case "containerd":
		return ContainerdResumer{Endpoint: endpoint}, nil
	case "cri-o":
		if len(texts) == 0 {
			return nil, errors.New("CRI-O's configuration was not given (MS2M_AGENT_RUNTIME_CONFIG): the agent does not know where its OCI runtime keeps the containers' state")
		}
		return CRIOResumer(texts)
	case "":
		return nil, fmt.Errorf("the node's runtime is not known (no answer to CRI Version at %s, and no runtime configuration that names it)", endpoint)
	default:
		return nil, fmt.Errorf("runtime %q: the agent cannot resume its containers", runtime)
	}
}
