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

	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/sign"
)

// migrateCmd is `migrator migrate <namespace>/<pod> --to <node>`: it checks
// every flag first, then migrates the pod, printing each phase as it ends,
// and the report. It returns the exit code: 2 for bad usage, 1 when the
// migration fails.
func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := migrateFlagSet(fs)
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
	o, problems := f.options()
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "migrator migrate: %s\n", strings.Join(problems, "\nmigrator migrate: "))
		return 2
	}
	o.namespace, o.pod = ns, pod

	rep, err := runMigration(ctx, o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "migrator migrate: %v\n", err)
		return 1
	}
	if o.asJSON {
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

// migrateFlags are migrate's flags, as given.
type migrateFlags struct {
	to, strategy, cutoff, name, kubeconfig, imageRepo *string
	agentTokenFile, keyFile, ms2mNamespace            *string
	thawAfterDump                                     *string
	replayMax, timeout                                *time.Duration
	agentPort                                         *int
	maxLag                                            *uint64
	keepImages, asJSON                                *bool
}

// migrateFlagSet defines migrate's flags on fs.
func migrateFlagSet(fs *flag.FlagSet) migrateFlags {
	return migrateFlags{
		to:             fs.String("to", "", "target node (required)"),
		strategy:       fs.String("strategy", string(contract.StrategyAuto), strings.Join(contract.StrategyNames(), ", ")+" (auto: statefulset-shadow for a StatefulSet's pod, else ms2m)"),
		replayMax:      fs.Duration("replay-max", 5*time.Second, "ms2m-cutoff: T_replay_max, the bound on replay after the source stops"),
		cutoff:         fs.String("cutoff", "formula", "ms2m-cutoff: when to stop the source: formula (T_cutoff = T_replay_max × μ / λ, the paper's eq. 5) or adaptive (as soon as the live backlog replays within T_replay_max, at the latest by the formula)"),
		name:           fs.String("name", "", "the migration's name (default: <pod>-<time>, at most 56 characters)"),
		kubeconfig:     fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG, else in-cluster)"),
		imageRepo:      fs.String("image-repo", os.Getenv("MS2M_IMAGE_REPO"), "repository for checkpoint images, as the nodes pull them (required; $MS2M_IMAGE_REPO)"),
		agentPort:      fs.Int("agent-port", 8090, "port of the node agents, on each node's InternalIP"),
		agentTokenFile: fs.String("agent-token-file", os.Getenv("MS2M_AGENT_TOKEN_FILE"), "file holding the node agents' token ($MS2M_AGENT_TOKEN_FILE; or $MS2M_AGENT_TOKEN)"),
		keyFile:        fs.String("signing-key-file", os.Getenv("MS2M_STATUS_KEY_FILE"), "file holding the controller's signing key, with which the webhook checks restores ($MS2M_STATUS_KEY_FILE; or $MS2M_STATUS_KEY; default: the Secret "+StatusKeySecret+" in --ms2m-namespace)"),
		ms2mNamespace:  fs.String("ms2m-namespace", "ms2m-system", "the namespace ms2m is installed in, for its signing key's Secret"),
		keepImages:     fs.Bool("keep-images", false, "keep the checkpoint images in the registry once the target serves (for debugging; each holds the process's memory)"),
		maxLag:         fs.Uint64("max-lag", 0, "ms2m: stop the source once the target is at most this many messages behind"),
		timeout:        fs.Duration("timeout", 5*time.Minute, "bound on each wait"),
		thawAfterDump:  fs.String("thaw-after-dump", "auto", "live checkpoints: have the node agent thaw the app as soon as CRIU's dump is done, not when the runtime resumes it after archiving the root filesystem: auto (only an app container with readOnlyRootFilesystem), always or never"),
		asJSON:         fs.Bool("json", false, "print the final report as JSON"),
	}
}

// migrateOptions are migrate's settings, checked.
type migrateOptions struct {
	namespace, pod string
	to             string
	name           string // "" for the default
	strategy       contract.Strategy
	cutoff         contract.CutoffRule
	thaw           migrate.ThawPolicy
	replayMax      time.Duration
	timeout        time.Duration
	maxLag         uint64
	kubeconfig     string
	imageRepo      string
	agentPort      int
	agentToken     string
	key            []byte // nil: read the Secret in ms2mNamespace
	ms2mNamespace  string
	keepImages     bool
	asJSON         bool
}

// options checks the flags and reads the agents' token and the signing key
// from their files or the environment. problems lists every flag at fault.
func (f migrateFlags) options() (o migrateOptions, problems []string) {
	o = migrateOptions{
		to: *f.to, name: *f.name, strategy: contract.Strategy(*f.strategy), replayMax: *f.replayMax, timeout: *f.timeout,
		maxLag: *f.maxLag, kubeconfig: *f.kubeconfig, imageRepo: *f.imageRepo, agentPort: *f.agentPort,
		ms2mNamespace: *f.ms2mNamespace, keepImages: *f.keepImages, asJSON: *f.asJSON,
	}
	if o.to == "" {
		problems = append(problems, "--to: the target node is required")
	}
	if o.imageRepo == "" {
		problems = append(problems, "--image-repo (or MS2M_IMAGE_REPO): where checkpoint images go is required, e.g. registry.example.com/ms2m/checkpoints")
	}
	if !o.strategy.Valid() {
		problems = append(problems, fmt.Sprintf("--strategy %q: want one of %s", *f.strategy, strings.Join(contract.StrategyNames(), ", ")))
	}
	var err error
	if o.thaw, err = migrate.ParseThawPolicy(*f.thawAfterDump); err != nil {
		problems = append(problems, "--thaw-after-dump: "+err.Error())
	}
	if o.cutoff, err = contract.ParseCutoffRule(*f.cutoff); err != nil {
		problems = append(problems, "--cutoff: "+err.Error())
	}
	o.agentToken = os.Getenv("MS2M_AGENT_TOKEN")
	if *f.agentTokenFile != "" {
		b, err := os.ReadFile(*f.agentTokenFile)
		if err != nil {
			problems = append(problems, fmt.Sprintf("--agent-token-file: %v", err))
		}
		o.agentToken = strings.TrimSpace(string(b))
	}
	if o.agentToken == "" && *f.agentTokenFile == "" {
		problems = append(problems, "the node agents' token: set --agent-token-file or MS2M_AGENT_TOKEN")
	}
	switch {
	case *f.keyFile != "":
		if o.key, err = sign.ReadKeyFile(*f.keyFile); err != nil {
			problems = append(problems, "--signing-key-file: "+err.Error())
		}
	case os.Getenv("MS2M_STATUS_KEY") != "":
		o.key = []byte(os.Getenv("MS2M_STATUS_KEY"))
		if err := sign.Check(o.key); err != nil {
			problems = append(problems, "MS2M_STATUS_KEY: "+err.Error())
		}
	}
	return o, problems
}

// runMigration migrates the pod as o says, printing each phase to stdout
// as it ends. The signing key, when o has none, is the Secret in
// o.ms2mNamespace; the sidecar's control port and token are the source
// pod's.
func runMigration(ctx context.Context, o migrateOptions, stdout io.Writer) (migrate.Report, error) {
	cs, err := kubeClient(o.kubeconfig)
	if err != nil {
		return migrate.Report{}, err
	}
	key := o.key
	if key == nil {
		s, err := cs.CoreV1().Secrets(o.ms2mNamespace).Get(ctx, StatusKeySecret, metav1.GetOptions{})
		if err != nil {
			return migrate.Report{}, fmt.Errorf("the controller's signing key, which the webhook checks every restore with: Secret %s/%s: %w; set --ms2m-namespace, --signing-key-file or MS2M_STATUS_KEY", o.ms2mNamespace, StatusKeySecret, err)
		}
		key = s.Data[StatusKeySecretKey]
	}
	src, err := cs.CoreV1().Pods(o.namespace).Get(ctx, o.pod, metav1.GetOptions{})
	if err != nil {
		return migrate.Report{}, err
	}
	port, token, err := migrate.SidecarControl(src, key)
	if err != nil {
		return migrate.Report{}, err
	}
	name := o.name
	if name == "" {
		name = migrate.MigrationName(o.pod, time.Now())
	}
	st := o.strategy
	if st == contract.StrategyAuto {
		st = migrate.ByOwner(src)
	}
	plan := migrate.Plan{
		Name: name, Namespace: o.namespace, Pod: o.pod, Container: inject.AppContainer(src), TargetNode: o.to,
		TargetPod: migrate.NextPodName(src), Strategy: st, MaxLag: o.maxLag, ReplayMax: o.replayMax, Cutoff: o.cutoff, Timeout: o.timeout,
		ThawAfterDump: o.thaw,
	}
	fmt.Fprintf(stdout, "migrating %s/%s to %s by %s (migration %s)\n", o.namespace, o.pod, o.to, st, name)
	began := time.Now()
	env := migrate.Env{
		Client:       cs,
		Agent:        agent.Client{Resolve: agent.ByNodeIP(cs, o.agentPort), Token: o.agentToken},
		ImageRepo:    o.imageRepo,
		ControlToken: token,
		ControlPort:  port,
		SigningKey:   key,
		KeepImages:   o.keepImages,
		Progress: func(phase string, took time.Duration) {
			printPhase(stdout, phase, took, time.Since(began))
		},
	}
	return migrate.Run(ctx, env, plan)
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
