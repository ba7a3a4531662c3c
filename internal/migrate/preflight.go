package migrate

import (
	"context"
	"fmt"
	"strings"

	"github.com/ms2m/ms2m/internal/contract"
)

// CapabilityReader is an optional NodeAgent method: it asks node's agent
// what the node's runtime can do (the agent's GET /v1/node). An agent that
// does not answer (an older one) makes it fail; that is no refusal.
type CapabilityReader interface {
	NodeCapabilities(ctx context.Context, node string) (contract.NodeCapabilities, error)
}

// NotCapable is the error of a migration refused by its preflight: a node
// that cannot checkpoint or restore. Reason is the Event's.
type NotCapable struct {
	Reason, Message string
}

func (e *NotCapable) Error() string { return e.Message }

// preflightCheck is one link of Preflight's chain: a refusal, or ok.
type preflightCheck func(src, dst *contract.NodeCapabilities, s contract.Strategy) (reason, message string, failed bool)

// preflightChecks run in order; the first that fails is the answer.
var preflightChecks = []preflightCheck{
	criuOn("source", func(src, _ *contract.NodeCapabilities) *contract.NodeCapabilities { return src }),
	sourceCheckpoints,
	criuOn("target", func(_, dst *contract.NodeCapabilities) *contract.NodeCapabilities { return dst }),
	targetRestores,
	sameRuntime,
}

// Preflight says whether a migration by strategy from the node of source
// to the node of target can work, from what their agents report: the
// source must checkpoint, the target restore (every strategy does both).
// A nil side is a node whose agent did not answer: not known, no refusal.
// It is pure: the capabilities in, a refusal's reason and message out.
func Preflight(source, target *contract.NodeCapabilities, strategy contract.Strategy) (reason, message string, ok bool) {
	for _, check := range preflightChecks {
		if reason, message, failed := check(source, target, strategy); failed {
			return reason, message, false
		}
	}
	return "", "", true
}

func criuOn(side string, pick func(src, dst *contract.NodeCapabilities) *contract.NodeCapabilities) preflightCheck {
	return func(src, dst *contract.NodeCapabilities, s contract.Strategy) (string, string, bool) {
		n := pick(src, dst)
		if n == nil || n.CRIUFound == nil || *n.CRIUFound {
			return "", "", false
		}
		verb := "checkpoint"
		if side == "target" {
			verb = "restore"
		}
		return contract.ReasonMigrationNodeNotCapable, fmt.Sprintf("the %s node %s has no CRIU, so it cannot %s the app (strategy %s): install CRIU on it (criu check must pass) or pick another %s node", side, n.Node, verb, s, side), true
	}
}

func sourceCheckpoints(src, _ *contract.NodeCapabilities, s contract.Strategy) (string, string, bool) {
	if src == nil || src.CheckpointEnabled == nil || *src.CheckpointEnabled {
		return "", "", false
	}
	return contract.ReasonMigrationNodeNotCapable, fmt.Sprintf("the source node %s cannot checkpoint (strategy %s): its %s does not allow it; set %s%s and restart the runtime", src.Node, s, runtimeName(src), src.Setting, inFile(src)), true
}

func targetRestores(_, dst *contract.NodeCapabilities, s contract.Strategy) (string, string, bool) {
	if dst == nil || dst.RestoreEnabled == nil || *dst.RestoreEnabled {
		return "", "", false
	}
	if dst.Setting == "" { // no setting turns it on (containerd 2.4)
		return contract.ReasonMigrationNodeNotCapable, fmt.Sprintf("the target node %s cannot restore a checkpoint (strategy %s): %s; pick another target", dst.Node, s, strings.Join(append([]string{"its " + runtimeName(dst) + " cannot"}, dst.Notes...), ": ")), true
	}
	return contract.ReasonMigrationNodeNotCapable, fmt.Sprintf("the target node %s cannot restore a checkpoint (strategy %s): restore is off in its %s; set %s%s and restart the runtime (docs/install.md), or pick another target", dst.Node, s, runtimeName(dst), dst.Setting, inFile(dst)), true
}

// sameRuntime refuses a pair of nodes whose agents report different
// container runtimes (containerd and CRI-O). Each restores from a checkpoint
// image in CreateContainer, but only from the archive its own
// CheckpointContainer wrote: on real nodes (containerd 2.3.7, CRI-O 1.34.0;
// TestCrossRuntimeRestore) CRI-O fails a containerd checkpoint with
// `failed to read "io.kubernetes.cri-o.Annotations": unexpected end of JSON
// input` and containerd a CRI-O one with `failed to read "status.dump"`.
// So such a pair is refused before anything is stopped. An unknown
// runtime on either side is no refusal.
func sameRuntime(src, dst *contract.NodeCapabilities, s contract.Strategy) (string, string, bool) {
	if src == nil || dst == nil || src.Runtime == "" || dst.Runtime == "" || src.Runtime == dst.Runtime {
		return "", "", false
	}
	return contract.ReasonMigrationNodeNotCapable, fmt.Sprintf("the source node %s runs %s and the target node %s runs %s (strategy %s): a checkpoint made by one container runtime does not restore in another (each reads files of the archive that only its own checkpoint writes); pick a target that runs %s", src.Node, runtimeName(src), dst.Node, runtimeName(dst), s, src.Runtime), true
}

func runtimeName(n *contract.NodeCapabilities) string {
	if n.Runtime == "" {
		return "container runtime"
	}
	if n.RuntimeVersion != "" {
		return n.Runtime + " " + n.RuntimeVersion
	}
	return n.Runtime
}

func inFile(n *contract.NodeCapabilities) string {
	if n.ConfigPath == "" {
		return ""
	}
	return " in " + n.ConfigPath
}

// preflight asks both nodes' agents what they can do and refuses a
// migration one of them cannot carry. An agent that does not answer is
// said in the report (Unchecked), and the migration goes on.
func (r *run) preflight(ctx context.Context, sourceNode string) error {
	cr, ok := r.env.Agent.(CapabilityReader)
	if !ok {
		return nil
	}
	ask := func(node string) *contract.NodeCapabilities {
		ctx, cancel := context.WithTimeout(ctx, r.env.Timeouts.Sidecar)
		defer cancel()
		c, err := cr.NodeCapabilities(ctx, node)
		if err != nil {
			r.rep.Unchecked = append(r.rep.Unchecked, fmt.Sprintf("node %s: its agent did not say what the node can do (an older agent?), so the preflight went on without it: %v", node, err))
			r.log.Info("preflight: a node was not checked", "node", node, "err", err.Error())
			return nil
		}
		c.Node = node
		return &c
	}
	src, dst := ask(sourceNode), ask(r.p.TargetNode)
	if reason, msg, ok := Preflight(src, dst, r.p.Strategy); !ok {
		return &NotCapable{Reason: reason, Message: msg}
	}
	return nil
}
