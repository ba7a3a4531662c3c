package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// The settings that turn checkpoint and restore on, as the preflight's
// messages name them.
const (
	// containerd 2.x, config version 3 (the CRI runtime plugin); version
	// 2 configs have the same key under plugins."io.containerd.grpc.v1.cri".
	containerdRestoreSetting = `[plugins."io.containerd.cri.v1.runtime"] enable_experimental_restore_via_create = true`
	crioCRIUSetting          = `[crio.runtime] enable_criu_support = true`
	// containerd 2.4 removed restore through CreateContainer: no setting
	// turns it on.
	containerd24Note   = "containerd 2.4 and later have no restore through CreateContainer, whatever the configuration says: restore targets need containerd 2.3 until pod-level restore (docs/runtimes.md)"
	crioRestoreSetting = `[crio.checkpoint_restore] container_level_enabled = "checkpoint_restore"`
)

// NodeProbe finds out what the node's runtime can do (GET /v1/node). Each
// part it is not configured for stays unknown.
type NodeProbe struct {
	// RuntimeEndpoint is the CRI socket its Version call goes to.
	RuntimeEndpoint string
	// RuntimeConfig are the runtime's configuration files as the agent
	// sees them (containerd's config.toml; CRI-O's crio.conf and its
	// drop-ins, later ones winning).
	RuntimeConfig []string
	// CRIUPath is the node's criu binary as the agent sees it (a hostPath
	// mount); empty: not checked.
	CRIUPath string
	// CgroupRoot is where the host's cgroups are mounted. Default
	// /sys/fs/cgroup.
	CgroupRoot string
	// Timeout bounds the probe's runtime call and criu run. Default 5 s.
	Timeout time.Duration
}

// Probe reports the node's capabilities; what it cannot find out is a note.
func (p NodeProbe) Probe(ctx context.Context) contract.NodeCapabilities {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var c contract.NodeCapabilities
	if p.RuntimeEndpoint != "" {
		name, version, err := criVersion(ctx, p.RuntimeEndpoint)
		if err != nil {
			c.Notes = append(c.Notes, err.Error())
		}
		c.Runtime, c.RuntimeVersion = normalRuntime(name), version
	}
	if p.CRIUPath != "" {
		found, version, err := criuVersion(ctx, p.CRIUPath)
		c.CRIUFound, c.CRIU = &found, version
		if err != nil {
			c.Notes = append(c.Notes, err.Error())
		}
	}
	if len(p.RuntimeConfig) > 0 {
		var texts []string
		for _, f := range p.RuntimeConfig {
			b, err := os.ReadFile(f)
			if errors.Is(err, os.ErrNotExist) {
				continue // a drop-in that is not there: the defaults hold
			}
			if err != nil {
				c.Notes = append(c.Notes, fmt.Sprintf("runtime config %s: %v", f, err))
				continue
			}
			texts = append(texts, string(b))
		}
		c.ConfigPath = strings.Join(p.RuntimeConfig, ", ")
		rs := RuntimeSettings(c.Runtime, c.RuntimeVersion, texts)
		c.CheckpointEnabled, c.RestoreEnabled, c.Setting = rs.Checkpoint, rs.Restore, rs.Setting
		if rs.Note != "" {
			c.Notes = append(c.Notes, rs.Note)
		}
	}
	root := p.CgroupRoot
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	c.CgroupVersion = cgroupVersion(root)
	return c
}

func (s *Server) nodeInfo(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Node == nil {
		httpError(w, http.StatusNotImplemented, errors.New("this agent has no node probe configured"))
		return
	}
	writeJSON(w, s.cfg.Node.Probe(r.Context()))
}

// criVersion asks the runtime at endpoint its name and version.
func criVersion(ctx context.Context, endpoint string) (name, version string, err error) {
	target := endpoint
	if !strings.Contains(target, "://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", "", fmt.Errorf("connect to the container runtime at %s: %w", endpoint, err)
	}
	defer conn.Close()
	res, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", "", fmt.Errorf("the container runtime at %s: Version: %w", endpoint, err)
	}
	return res.RuntimeName, res.RuntimeVersion, nil
}

// normalRuntime names a runtime as CRI's Version answers it: containerd,
// cri-o.
func normalRuntime(name string) string {
	switch n := strings.ToLower(name); {
	case strings.Contains(n, "containerd"):
		return "containerd"
	case strings.Contains(n, "cri-o"), n == "crio":
		return "cri-o"
	default:
		return n
	}
}

// criuVersion runs `criu --version`. A binary that is not there is found
// false; one that does not run is found, with the error.
func criuVersion(ctx context.Context, path string) (found bool, version string, err error) {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, "", fmt.Errorf("no CRIU at %s", path)
		}
		return false, "", fmt.Errorf("CRIU at %s: %w", path, err)
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return true, "", fmt.Errorf("%s --version: %w", path, err)
	}
	return true, ParseCRIUVersion(string(out)), nil
}

var criuVersionRE = regexp.MustCompile(`(?m)^Version:\s*(\S+)`)

// ParseCRIUVersion reads the version from `criu --version`'s output
// ("Version: 4.1\nGitID: ..."); "" if there is none.
func ParseCRIUVersion(out string) string {
	m := criuVersionRE.FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	return m[1]
}

// cgroupVersion is 2 if root is the unified hierarchy, 1 if it holds v1
// controllers, 0 if neither shows.
func cgroupVersion(root string) int {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return 2
	}
	for _, c := range []string{"freezer", "memory", "cpu"} {
		if _, err := os.Stat(filepath.Join(root, c)); err == nil {
			return 1
		}
	}
	return 0
}

// Settings is what a runtime's configuration says about checkpoint and
// restore (nil: not known), with the setting that turns them on.
type Settings struct {
	Checkpoint, Restore *bool
	Setting             string
	Note                string
}

// RuntimeSettings reads runtime's (containerd, cri-o) configuration texts,
// later ones winning, for whether it checkpoints and restores. version
// decides containerd's default.
func RuntimeSettings(runtime, version string, texts []string) Settings {
	kv := mergeTOMLish(texts)
	if runtime == "" {
		// The runtime did not answer CRI's Version: its configuration
		// tells which one it is.
		runtime = configRuntime(kv)
	}
	yes := true
	switch runtime {
	case "containerd":
		s := Settings{Checkpoint: &yes, Setting: containerdRestoreSetting}
		if major, minor, _, ok := semver(version); ok && (major > 2 || major == 2 && minor >= 4) {
			// Restore through CreateContainer is gone, whatever the
			// configuration says.
			no := false
			s.Restore, s.Setting, s.Note = &no, "", containerd24Note
			return s
		}
		for _, k := range []string{`plugins.io.containerd.cri.v1.runtime.enable_experimental_restore_via_create`, `plugins.io.containerd.grpc.v1.cri.enable_experimental_restore_via_create`} {
			if v, ok := kv[k]; ok {
				b := v == "true"
				s.Restore = &b
				return s
			}
		}
		b, known := containerdRestoreDefault(version)
		if known {
			s.Restore = &b
		} else {
			s.Note = fmt.Sprintf("containerd %q: the default of enable_experimental_restore_via_create is not known for this version", version)
		}
		return s
	case "cri-o":
		s := Settings{Setting: crioCRIUSetting}
		if v, ok := kv["crio.runtime.enable_criu_support"]; ok {
			b := v == "true"
			s.Checkpoint, s.Restore = &b, &b
			if !b {
				return s
			}
		}
		if v, ok := kv["crio.checkpoint_restore.container_level_enabled"]; ok {
			// "none", "checkpoint_only" (the default where the option
			// exists) or "checkpoint_restore".
			s.Setting = crioRestoreSetting
			var ck, rs bool
			switch strings.ToLower(v) {
			case "checkpoint_restore":
				ck, rs = true, true
			case "checkpoint_only":
				ck = true
			case "none":
			default:
				s.Checkpoint, s.Restore = nil, nil
				s.Note = fmt.Sprintf("CRI-O's [crio.checkpoint_restore] container_level_enabled = %q is none of none, checkpoint_only, checkpoint_restore", v)
				return s
			}
			s.Checkpoint, s.Restore = &ck, &rs
		}
		return s
	case "":
		return Settings{Note: "the runtime is not known (no answer to CRI Version), so its configuration was not read"}
	default:
		return Settings{Note: fmt.Sprintf("runtime %q: its configuration is not read", runtime)}
	}
}

// containerdRestoreDefault is whether containerd version restores through
// CreateContainer when its configuration does not say: on before 2.2.7
// and 2.3.4, off from them on (and gone from 2.4).
func containerdRestoreDefault(version string) (on, known bool) {
	major, minor, patch, ok := semver(version)
	if !ok {
		return false, false
	}
	switch {
	case major < 2:
		return true, true
	case major > 2 || minor >= 4:
		return false, true
	case minor == 3:
		return patch < 4, true
	case minor == 2:
		return patch < 7, true
	default:
		return true, true
	}
}

// semver reads "v2.3.4", "2.3.4-rc.1" or "2.3.4+unknown".
func semver(v string) (major, minor, patch int, ok bool) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+ "); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return 0, 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return 0, 0, 0, false
		}
		n[i] = x
	}
	return n[0], n[1], n[2], true
}

// mergeTOMLish reads configuration texts with ParseTOMLish, later ones
// winning.
func mergeTOMLish(texts []string) map[string]string {
	kv := map[string]string{}
	for _, t := range texts {
		for k, v := range ParseTOMLish(t) {
			kv[k] = v
		}
	}
	return kv
}

// configRuntime is the runtime whose configuration kv is (cri-o,
// containerd), by its keys; "" if they do not tell.
func configRuntime(kv map[string]string) string {
	runtime := ""
	for k := range kv {
		switch {
		case strings.HasPrefix(k, "crio."):
			runtime = "cri-o"
		case strings.HasPrefix(k, "plugins.io.containerd."):
			runtime = "containerd"
		}
	}
	return runtime
}

// ParseTOMLish reads the flat key = value settings of a TOML file into
// table.key (table names with their quotes dropped), enough for the
// runtimes' booleans and strings: string values lose their quotes,
// comments and arrays are skipped.
func ParseTOMLish(text string) map[string]string {
	out := map[string]string{}
	table := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			end := strings.LastIndex(line, "]")
			if end < 0 {
				continue
			}
			table = unquoteKey(strings.Trim(line[:end], "[]"))
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k, v = unquoteKey(strings.TrimSpace(k)), strings.TrimSpace(v)
		if k == "" {
			continue
		}
		switch {
		case strings.HasPrefix(v, `"`) || strings.HasPrefix(v, `'`):
			q := v[:1]
			rest := v[1:]
			end := strings.Index(rest, q)
			if end < 0 {
				continue
			}
			v = rest[:end]
		default:
			if i := strings.Index(v, "#"); i >= 0 {
				v = strings.TrimSpace(v[:i])
			}
			if strings.HasPrefix(v, "[") || strings.HasPrefix(v, "{") {
				continue
			}
		}
		if table != "" {
			k = table + "." + k
		}
		out[k] = v
	}
	return out
}

// unquoteKey drops the quotes of a dotted TOML key's parts:
// plugins."io.containerd.cri.v1.runtime" → plugins.io.containerd.cri.v1.runtime.
func unquoteKey(k string) string {
	var parts []string
	for _, p := range strings.Split(k, ".") {
		parts = append(parts, strings.Trim(strings.TrimSpace(p), `"'`))
	}
	return strings.Join(parts, ".")
}
