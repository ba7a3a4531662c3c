package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The archives of checkpoints that no image was built from. An archive
// holds the process's whole memory; the build removes it once the image
// is pushed, but a migration can end between the checkpoint and the
// build (the migrator discards the checkpoint, or dies), the build can
// fail, and the agent or the kubelet can die while the runtime writes the
// archive, which then has nobody to remove it. So the agent notes each
// checkpoint it asks for in a journal (a file per checkpoint in
// CheckpointDir/.ms2m-agent) before it asks, and the janitor removes the
// archives of a noted checkpoint that is ArchiveGrace old and has no
// checkpoint or build under way in this process: a journal that a
// previous agent left is swept the same way. Archives of checkpoints the
// agent did not ask for (kubectl's, say) are never touched.

// DefaultArchiveGrace is Config.ArchiveGrace's default: longer than the
// longest checkpoint the agent allows.
const DefaultArchiveGrace = maxCheckpointTimeout + 5*time.Minute

const journalDir = ".ms2m-agent"

// janitor is the journal and what this process has under way.
type janitor struct {
	dir   string // the journal
	ckpt  string // the checkpoint folder
	grace time.Duration
	keep  bool
	start time.Time // when this process began: older entries are a previous agent's

	mu     sync.Mutex
	busy   map[string]int // journal entries whose checkpoint is under way
	builds map[string]int // archives being built
}

func newJanitor(cfg Config) *janitor {
	grace := cfg.ArchiveGrace
	if grace <= 0 {
		grace = DefaultArchiveGrace
	}
	return &janitor{dir: filepath.Join(cfg.CheckpointDir, journalDir), ckpt: cfg.CheckpointDir, grace: grace, keep: cfg.KeepArchives, start: time.Now(),
		busy: map[string]int{}, builds: map[string]int{}}
}

// begin notes a checkpoint of container of ns/pod before it is asked
// for; done is called once the kubelet answered.
// With KeepArchives there is no journal: nothing is removed, and the
// checkpoint folder may be read-only.
func (j *janitor) begin(ns, pod, container string) (entry string, done func(), err error) {
	if j.keep {
		return "", func() {}, nil
	}
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("the checkpoint journal %s: %w", j.dir, err)
	}
	entry = filepath.Join(j.dir, strings.Join([]string{ns, pod, container, strconv.FormatInt(time.Now().UnixNano(), 10)}, "_"))
	if err := os.WriteFile(entry, nil, 0o600); err != nil {
		return "", nil, fmt.Errorf("the checkpoint journal: %w", err)
	}
	j.mu.Lock()
	j.busy[entry]++
	j.mu.Unlock()
	return entry, func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.busy[entry]--; j.busy[entry] <= 0 {
			delete(j.busy, entry)
		}
	}, nil
}

// taken records the archive of entry's checkpoint.
func (j *janitor) taken(entry, archive string) error {
	if entry == "" {
		return nil
	}
	return os.WriteFile(entry, []byte(archive), 0o600)
}

// building marks archive as read by a build until done is called.
func (j *janitor) building(archive string) (done func()) {
	j.mu.Lock()
	j.builds[archive]++
	j.mu.Unlock()
	return func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.builds[archive]--; j.builds[archive] <= 0 {
			delete(j.builds, archive)
		}
	}
}

// built forgets the entries of archive: its build ended, and removed it
// or kept it as configured.
func (j *janitor) built(archive string) {
	if j.keep {
		return
	}
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(j.dir, e.Name())
		if b, err := os.ReadFile(p); err == nil && string(b) == archive {
			os.Remove(p)
		}
	}
}

// entry is a journal entry: a checkpoint the agent asked for.
type entry struct {
	path               string
	ns, pod, container string
	at                 time.Time
	archive            string // the kubelet's answer, once it came
}

func (e entry) key() string { return e.ns + "/" + e.pod + "/" + e.container }

// entries reads the journal.
func (j *janitor) entries() ([]entry, error) {
	ents, err := os.ReadDir(j.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []entry
	for _, e := range ents {
		f := strings.Split(e.Name(), "_")
		if len(f) != 4 || !e.Type().IsRegular() {
			continue // not an entry
		}
		nano, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			continue
		}
		en := entry{path: filepath.Join(j.dir, e.Name()), ns: f[0], pod: f[1], container: f[2], at: time.Unix(0, nano)}
		if b, err := os.ReadFile(en.path); err == nil {
			en.archive = string(b)
		}
		out = append(out, en)
	}
	slices.SortFunc(out, func(a, b entry) int { return a.at.Compare(b.at) })
	return out, nil
}

// sweep removes the archives of the entries that are grace old and not
// under way, and those entries; it returns the archives removed. An
// entry's archives are the one the kubelet answered, or, if no answer
// came, those of its container taken from its time until the next entry
// of the same container; an archive another entry answered is that one's.
func (j *janitor) sweep(now time.Time) ([]string, error) {
	if j.keep {
		return nil, nil
	}
	all, err := j.entries()
	if err != nil {
		return nil, err
	}
	answered := map[string]bool{}
	for _, e := range all {
		if e.archive != "" {
			answered[e.archive] = true
		}
	}
	var removed []string
	var errs []error
	for i, e := range all {
		j.mu.Lock()
		busy := j.busy[e.path] > 0
		j.mu.Unlock()
		if busy || now.Sub(e.at) < j.grace {
			continue
		}
		var archives []string
		if e.archive != "" {
			if filepath.Dir(filepath.Clean(e.archive)) == filepath.Clean(j.ckpt) {
				archives = []string{e.archive}
			}
		} else {
			until := time.Time{}
			for _, n := range all[i+1:] {
				if n.key() == e.key() {
					until = n.at
					break
				}
			}
			found, err := j.archivesOf(e, until)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, a := range found {
				if !answered[a] {
					archives = append(archives, a)
				}
			}
		}
		left := false
		for _, a := range archives {
			j.mu.Lock()
			inBuild := j.builds[a] > 0
			j.mu.Unlock()
			if inBuild {
				left = true
				continue
			}
			if j.keep {
				continue
			}
			if err := os.Remove(a); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
				left = true
				continue
			} else if err == nil {
				removed = append(removed, a)
			}
		}
		if !left {
			os.Remove(e.path)
		}
	}
	return removed, errors.Join(errs...)
}

// archivesOf lists the kubelet's archives of e's container taken at or
// after e.at and before until (zero: no end), as the kubelet names them:
// "checkpoint-<pod>_<ns>-<container>-<RFC 3339 time>.tar". The time may
// have whole seconds, so a second earlier counts.
func (j *janitor) archivesOf(e entry, until time.Time) ([]string, error) {
	ents, err := os.ReadDir(j.ckpt)
	if err != nil {
		return nil, err
	}
	prefix := "checkpoint-" + e.pod + "_" + e.ns + "-" + e.container + "-"
	from := e.at.Truncate(time.Second)
	var out []string
	for _, d := range ents {
		n := d.Name()
		if !d.Type().IsRegular() || !strings.HasPrefix(n, prefix) || !strings.HasSuffix(n, ".tar") {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSuffix(strings.TrimPrefix(n, prefix), ".tar"))
		if err != nil || t.Before(from) || (!until.IsZero() && !t.Before(until)) {
			continue
		}
		out = append(out, filepath.Join(j.ckpt, n))
	}
	return out, nil
}

// left lists the containers whose checkpoints a previous agent process
// asked for and got no answer to (it died first), once each.
func (j *janitor) left() ([]entry, error) {
	all, err := j.entries()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []entry
	for _, e := range all {
		if e.archive == "" && e.at.Before(j.start) && !seen[e.key()] {
			seen[e.key()] = true
			out = append(out, e)
		}
	}
	return out, nil
}

// SweepArchives runs the janitor until ctx ends: at once, then every
// tenth of the grace (at least every second, at most every minute). Its
// first pass also resumes the containers that checkpoints a previous
// agent left unanswered may have left paused (unpause.go).
func (s *Server) SweepArchives(ctx context.Context) {
	every := min(max(s.jan.grace/10, time.Second), time.Minute)
	left, err := s.jan.left()
	if err != nil {
		s.log.Warn("the checkpoint journal could not be read: containers a previous agent's checkpoints left paused are not resumed", "err", err)
	}
	for _, e := range left {
		go s.unpauseAfter(e.ns, e.pod, e.container, "left unanswered by a previous agent")
	}
	for {
		removed, err := s.jan.sweep(time.Now())
		for _, a := range removed {
			s.log.Info("checkpoint archive removed: no image was built from it", "archive", a, "grace", s.jan.grace)
		}
		if err != nil {
			s.log.Warn("checkpoint archives of abandoned checkpoints not removed; delete them by hand, they hold processes' memory", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
