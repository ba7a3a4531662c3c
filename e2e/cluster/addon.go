package cluster

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Addon is a long-running process that lives beside the cluster and goes
// with it: `up --with-ms2m` runs ms2m's webhook, controller and node agents
// as addons. Like the cluster's own components it runs detached, in a
// session of its own with the cluster's minimal environment, has a pid file
// under STATE/run and a log under STATE/logs; status lists it and Down
// stops it first.
type Addon struct {
	// Name is unique among the addons: letters, digits and dashes.
	Name string
	// Bin is the executable's absolute path; Args follow it.
	Bin  string
	Args []string
	// Node runs the addon in node Node's network namespace (1-based); 0
	// runs it on the host.
	Node int
	// Env is added to the cluster's minimal environment (PATH, HOME, LANG).
	Env []string
}

// addonPrefix marks an addon's component name, and so its pid file and
// log, apart from the cluster's own components.
const addonPrefix = "addon-"

// StartAddon starts a (stopping one of the same name that still runs) and
// returns its pid and log file.
func (c *Cluster) StartAddon(a Addon) (pid int, log string, err error) {
	if a.Name == "" || strings.ContainsAny(a.Name, "/ \t") {
		return 0, "", fmt.Errorf("addon name %q: want letters, digits and dashes", a.Name)
	}
	if a.Node < 0 || a.Node > c.nodes {
		return 0, "", fmt.Errorf("addon %s: node %d, the cluster has nodes 1 to %d", a.Name, a.Node, c.nodes)
	}
	comp := addonPrefix + a.Name
	if err := stop(c.l, comp, 10*time.Second); err != nil {
		return 0, "", fmt.Errorf("addon %s: stop the one that runs: %w", a.Name, err)
	}
	p := process{name: comp, bin: a.Bin, args: a.Args, env: a.Env}
	if a.Node > 0 {
		p.netns = NodeName(a.Node)
	}
	pid, err = start(c.l, p)
	return pid, c.l.log(comp), err
}

// StopAddon stops the addon name (SIGTERM, SIGKILL after 10 s), if it runs.
func (c *Cluster) StopAddon(name string) error { return stop(c.l, addonPrefix+name, 10*time.Second) }

// AddonRunning returns the pid of addon name and whether it runs.
func (c *Cluster) AddonRunning(name string) (int, bool) { return running(c.l, addonPrefix+name) }

// AddonLog is the log file of addon name.
func (c *Cluster) AddonLog(name string) string { return c.l.log(addonPrefix + name) }

// addons lists the component names of the addons that have a pid file,
// sorted.
func addons(l layout) []string {
	files, _ := filepath.Glob(l.pid(addonPrefix + "*"))
	var comps []string
	for _, f := range files {
		comps = append(comps, strings.TrimSuffix(filepath.Base(f), ".pid"))
	}
	sort.Strings(comps)
	return comps
}

// stopAddons stops every addon; Down does it before anything else, so
// that no addon sees its cluster go away under it.
func stopAddons(l layout) error {
	var errs []error
	for _, comp := range addons(l) {
		if err := stop(l, comp, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", strings.TrimPrefix(comp, addonPrefix), err))
		}
	}
	return errors.Join(errs...)
}

// AddonName is the name an addon's component goes by in Status.
func AddonName(comp string) (string, bool) { return strings.CutPrefix(comp, addonPrefix) }

// FindRepo returns the root of the repository that holds the working
// directory, or "".
func FindRepo() string { return findRepo() }
