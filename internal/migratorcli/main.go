package migratorcli

import (
	"context"
	"fmt"
	"io"
	"strings"
)

const usage = `migrator moves stateful message consumers between Kubernetes nodes.

Usage:
  migrator migrate <namespace>/<pod> --to <node> [flags]   run one migration and show its phases
  migrator status [<namespace>/<pod>] [-namespace ns | -A] [-o table|json]   list recorded migrations, or show one in full
  migrator nodes [-o table|json]                           list what each node's runtime can do (the migration preflight's view)
  migrator drain <node> [flags]                            cordon a node and evict its pods as kubectl drain does; pods opted in by ms2m.io/on-evict migrate instead (a live table, a summary)
  migrator controller                                      act on pods annotated ms2m.io/migrate-to (configured by MS2M_* variables)
  migrator agent                                           run the node agent (configured by MS2M_AGENT_* variables)
  migrator broker-users ensure|rotate|remove <namespace>...   per-namespace broker users for the replay logs, by hand

Run "migrator <command> -h" for a command's flags.
`

// Main runs the command in args (without the program name) and returns the
// exit code: 0 done, 1 failed, 2 bad usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "migrate":
		return migrateCmd(ctx, args[1:], stdout, stderr)
	case "agent":
		return agentCmd(ctx, args[1:], stdout, stderr)
	case "status":
		return statusCmd(ctx, args[1:], stdout, stderr)
	case "nodes":
		return nodesCmd(ctx, args[1:], stdout, stderr)
	case "drain":
		return drainCmd(ctx, args[1:], stdout, stderr)
	case "controller":
		return controllerCmd(ctx, args[1:], stdout, stderr)
	case "broker-users":
		return brokerUsersCmd(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "migrator: unknown command %q (want migrate, status, nodes, drain, controller, agent or broker-users)\n\n%s", args[0], usage)
		return 2
	}
}

// splitPod parses namespace/pod.
func splitPod(s string) (ns, pod string, err error) {
	ns, pod, ok := strings.Cut(s, "/")
	if !ok || ns == "" || pod == "" || strings.Contains(pod, "/") {
		return "", "", fmt.Errorf("%q is not <namespace>/<pod>", s)
	}
	return ns, pod, nil
}
