package migratorcli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// nodeRow is one node as `migrator nodes` shows it: what its agent
// reported, or why it did not.
type nodeRow struct {
	Node  string                     `json:"node"`
	Caps  *contract.NodeCapabilities `json:"capabilities,omitempty"`
	Error string                     `json:"error,omitempty"`
}

func nodesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nodes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	agentPort := fs.Int("agent-port", 8090, "port of the node agents, on each node's InternalIP")
	agentTokenFile := fs.String("agent-token-file", os.Getenv("MS2M_AGENT_TOKEN_FILE"), "file holding the node agents' token ($MS2M_AGENT_TOKEN_FILE; or $MS2M_AGENT_TOKEN)")
	agentCAFile := fs.String("agent-ca-file", os.Getenv("MS2M_AGENT_CA_FILE"), "the CA the node agents' TLS certificate is checked against ($MS2M_AGENT_CA_FILE; empty: plain HTTP)")
	agentServerName := fs.String("agent-server-name", os.Getenv("MS2M_AGENT_SERVER_NAME"), "the name on the node agents' certificate ($MS2M_AGENT_SERVER_NAME; default "+DefaultAgentServerName+")")
	output := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 || (*output != "table" && *output != "json") {
		fmt.Fprintln(stderr, "migrator nodes: takes no arguments; -o is table or json")
		return 2
	}
	token := os.Getenv("MS2M_AGENT_TOKEN")
	if *agentTokenFile != "" {
		b, err := os.ReadFile(*agentTokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "migrator nodes: --agent-token-file: %v\n", err)
			return 2
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		fmt.Fprintln(stderr, "migrator nodes: the node agents' token: set --agent-token-file or MS2M_AGENT_TOKEN")
		return 2
	}
	cs, err := kubeClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "migrator nodes: %v\n", err)
		return 1
	}
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(stderr, "migrator nodes: %v\n", err)
		return 1
	}
	c, err := agentClient(cs, *agentPort, token, *agentCAFile, *agentServerName)
	if err != nil {
		fmt.Fprintf(stderr, "migrator nodes: %v\n", err)
		return 2
	}
	rows := make([]nodeRow, 0, len(list.Items))
	for _, n := range list.Items {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		caps, err := c.NodeCapabilities(actx, n.Name)
		cancel()
		row := nodeRow{Node: n.Name}
		if err != nil {
			row.Error = err.Error()
		} else {
			row.Caps = &caps
		}
		rows = append(rows, row)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintf(stderr, "migrator nodes: %v\n", err)
			return 1
		}
		return 0
	}
	if err := writeNodes(stdout, rows); err != nil {
		fmt.Fprintf(stderr, "migrator nodes: %v\n", err)
		return 1
	}
	return 0
}

var nodesHeader = []string{"NODE", "RUNTIME", "CRIU", "CHECKPOINT", "RESTORE", "CGROUP", "NOTE"}

// writeNodes prints one row per node; "?" is what its agent could not
// find out, and a node whose agent did not answer says why.
func writeNodes(w io.Writer, rows []nodeRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(nodesHeader, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(nodeCells(r), "\t"))
	}
	return tw.Flush()
}

func nodeCells(r nodeRow) []string {
	if r.Caps == nil {
		return []string{r.Node, "?", "?", "?", "?", "?", oneLine("agent did not answer (an older agent?): " + r.Error)}
	}
	c := r.Caps
	rt := strings.TrimSpace(c.Runtime + " " + c.RuntimeVersion)
	criu := "?"
	if c.CRIUFound != nil {
		criu = "missing"
		if *c.CRIUFound {
			criu = "found"
			if c.CRIU != "" {
				criu = c.CRIU
			}
		}
	}
	cg := "?"
	if c.CgroupVersion != 0 {
		cg = "v" + strconv.Itoa(c.CgroupVersion)
	}
	var note []string
	if c.Setting != "" && ((c.RestoreEnabled != nil && !*c.RestoreEnabled) || (c.CheckpointEnabled != nil && !*c.CheckpointEnabled)) {
		note = append(note, "set "+c.Setting)
	}
	note = append(note, c.Notes...)
	return []string{r.Node, dash(rt), criu, yesNo(c.CheckpointEnabled), yesNo(c.RestoreEnabled), cg, oneLine(dash(strings.Join(note, "; ")))}
}

func yesNo(b *bool) string {
	switch {
	case b == nil:
		return "?"
	case *b:
		return "yes"
	default:
		return "no"
	}
}
