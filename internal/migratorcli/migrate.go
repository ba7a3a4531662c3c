package migratorcli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/sign"
)

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	to := fs.String("to", "", "target node (required)")
	strategy := fs.String("strategy", string(contract.StrategyAuto), strings.Join(contract.StrategyNames(), ", ")+" (auto: statefulset-shadow for a StatefulSet's pod, else ms2m)")
	replayMax := fs.Duration("replay-max", 5*time.Second, "ms2m-cutoff: T_replay_max, the bound on replay after the source stops")
	cutoff := fs.String("cutoff", "formula", "ms2m-cutoff: when to stop the source: formula (T_cutoff = T_replay_max × μ / λ, the paper's eq. 5) or adaptive (as soon as the live backlog replays within T_replay_max, at the latest by the formula)")
	name := fs.String("name", "", "the migration's name (default: <pod>-<time>, at most 56 characters)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	imageRepo := fs.String("image-repo", os.Getenv("MS2M_IMAGE_REPO"), "repository for checkpoint images, as the nodes pull them (required; $MS2M_IMAGE_REPO)")
	agentPort := fs.Int("agent-port", 8090, "port of the node agents, on each node's InternalIP")
	agentTokenFile := fs.String("agent-token-file", os.Getenv("MS2M_AGENT_TOKEN_FILE"), "file holding the node agents' token ($MS2M_AGENT_TOKEN_FILE; or $MS2M_AGENT_TOKEN)")
	agentCAFile := fs.String("agent-ca-file", os.Getenv("MS2M_AGENT_CA_FILE"), "the CA the node agents' TLS certificate is checked against ($MS2M_AGENT_CA_FILE; empty: plain HTTP, to agents started with MS2M_AGENT_PLAIN_HTTP)")
	agentServerName := fs.String("agent-server-name", os.Getenv("MS2M_AGENT_SERVER_NAME"), "the name on the node agents' certificate ($MS2M_AGENT_SERVER_NAME; default "+DefaultAgentServerName+")")
	via := fs.String("checkpoint-via", envOr("MS2M_CHECKPOINT_VIA", "agent"), "agent: the source node's agent asks its kubelet for the checkpoint (nodes/checkpoint); apiserver: through the API server's node proxy (needs nodes/proxy) ($MS2M_CHECKPOINT_VIA)")
	keyFile := fs.String("signing-key-file", os.Getenv("MS2M_STATUS_KEY_FILE"), "file holding the controller's signing key, with which the webhook checks restores ($MS2M_STATUS_KEY_FILE; or $MS2M_STATUS_KEY; default: the Secret "+StatusKeySecret+" in --ms2m-namespace)")
	ms2mNamespace := fs.String("ms2m-namespace", "ms2m-system", "the namespace ms2m is installed in, for its signing key's Secret")
	keepImages := fs.Bool("keep-images", false, "keep the checkpoint images in the registry once the target serves (for debugging; each holds the process's memory)")
	maxLag := fs.Uint64("max-lag", 0, "ms2m: stop the source once the target is at most this many messages behind")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on each wait")
	thawAfterDump := fs.String("thaw-after-dump", "auto", "live checkpoints: have the node agent thaw the app as soon as CRIU's dump is done, not when the runtime resumes it after archiving the root filesystem: auto (only an app container with readOnlyRootFilesystem), always or never")
	asJSON := fs.Bool("json", false, "print the final report as JSON")
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(positional) != 1 {
		fmt.Fprintln(stderr, "migrator migrate: want exactly one <namespace>/<pod>")
		return 2
	}
	ns, pod, err := splitPod(positional[0])
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 2
	}
	var problems []string
	if *to == "" {
		problems = append(problems, "--to: the target node is required")
	}
	if *imageRepo == "" {
		problems = append(problems, "--image-repo (or MS2M_IMAGE_REPO): where checkpoint images go is required, e.g. registry.example.com/ms2m/checkpoints")
	}
	st := contract.Strategy(*strategy)
	if !st.Valid() {
		problems = append(problems, fmt.Sprintf("--strategy %q: want one of %s", *strategy, strings.Join(contract.StrategyNames(), ", ")))
	}
	thaw, err := migrate.ParseThawPolicy(*thawAfterDump)
	if err != nil {
		problems = append(problems, "--thaw-after-dump: "+err.Error())
	}
	rule, err := contract.ParseCutoffRule(*cutoff)
	if err != nil {
		problems = append(problems, "--cutoff: "+err.Error())
	}
	agentToken := os.Getenv("MS2M_AGENT_TOKEN")
	if *agentTokenFile != "" {
		b, err := os.ReadFile(*agentTokenFile)
		if err != nil {
			problems = append(problems, fmt.Sprintf("--agent-token-file: %v", err))
		}
		agentToken = strings.TrimSpace(string(b))
	}
	if agentToken == "" && *agentTokenFile == "" {
		problems = append(problems, "the node agents' token: set --agent-token-file or MS2M_AGENT_TOKEN")
	}
	viaAPIServer, err := checkpointVia(*via)
	if err != nil {
		problems = append(problems, "--checkpoint-via: "+err.Error())
	}
	var key []byte
	switch {
	case *keyFile != "":
		if key, err = sign.ReadKeyFile(*keyFile); err != nil {
			problems = append(problems, "--signing-key-file: "+err.Error())
		}
	case os.Getenv("MS2M_STATUS_KEY") != "":
		key = []byte(os.Getenv("MS2M_STATUS_KEY"))
		if err := sign.Check(key); err != nil {
			problems = append(problems, "MS2M_STATUS_KEY: "+err.Error())
		}
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "migrator migrate: %s\n", strings.Join(problems, "\nmigrator migrate: "))
		return 2
	}

	cs, err := kubeClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 1
	}
	if key == nil {
		s, err := cs.CoreV1().Secrets(*ms2mNamespace).Get(ctx, StatusKeySecret, metav1.GetOptions{})
		if err != nil {
			fmt.Fprintf(stderr, "migrator migrate: the controller's signing key, which the webhook checks every restore with: Secret %s/%s: %v; set --ms2m-namespace, --signing-key-file or MS2M_STATUS_KEY\n", *ms2mNamespace, StatusKeySecret, err)
			return 1
		}
		key = s.Data[StatusKeySecretKey]
	}
	ac, err := agentClient(cs, *agentPort, agentToken, *agentCAFile, *agentServerName)
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 1
	}
	src, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 1
	}
	port, token, err := migrate.SidecarControl(src, key)
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 1
	}
	if *name == "" {
		*name = migrate.MigrationName(pod, time.Now())
	}
	if st == contract.StrategyAuto {
		st = migrate.ByOwner(src)
	}
	plan := migrate.Plan{
		Name: *name, Namespace: ns, Pod: pod, Container: inject.AppContainer(src), TargetNode: *to,
		TargetPod: migrate.NextPodName(src), Strategy: st, MaxLag: *maxLag, ReplayMax: *replayMax, Cutoff: rule, Timeout: *timeout,
		ThawAfterDump: thaw,
	}
	fmt.Fprintf(stdout, "migrating %s/%s to %s by %s (migration %s)\n", ns, pod, *to, st, *name)
	began := time.Now()
	env := migrate.Env{
		Client:                     cs,
		Agent:                      ac,
		CheckpointThroughAPIServer: viaAPIServer,
		ImageRepo:                  *imageRepo,
		ControlToken:               token,
		ControlPort:                port,
		SigningKey:                 key,
		KeepImages:                 *keepImages,
		Progress: func(phase string, took time.Duration) {
			printPhase(stdout, phase, took, time.Since(began))
		},
	}
	rep, err := migrate.Run(ctx, env, plan)
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = printReport(stdout, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: the migration is done, but its report could not be written: %v\n", err)
		return 1
	}
	return 0
}

func printReport(w io.Writer, rep migrate.Report) error {
	fmt.Fprintln(w, "done")
	return writeReportLines(w, rep)
}

// parseInterleaved parses flags that may come before or after positional
// arguments, as kubectl users expect.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
