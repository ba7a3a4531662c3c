package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ms2m/ms2m/internal/contract"
)

// nodeGoals are the goals of the cluster parts.
func nodeGoals(res results) []goal {
	var gs []goal
	if s := res.Strategies; s != nil {
		for _, r := range s.Rates {
			gs = append(gs, goal{
				Name:     fmt.Sprintf("ms2m switch time against stop-and-copy at %g msg/s (medians of %d each)", r.RateMsgsPerSec, s.Rounds),
				Target:   fmt.Sprintf("≤ %g%% of stop-and-copy's", goalDowntimeRatio*100),
				Measured: fmt.Sprintf("%s (%s ms against %s ms)", pct2(r.DowntimeRatio), fmtMs1(r.MS2MDowntimeMs), fmtMs1(r.SCDowntimeMs)),
				Pass:     r.GoalMet,
			}, goal{
				Name:     fmt.Sprintf("restored state exact at %g msg/s", r.RateMsgsPerSec),
				Target:   "every migration succeeds with the producer's hash",
				Measured: fmt.Sprintf("%d of %d failed", r.Failed, len(r.MS2M)+len(r.StopAndCopy)),
				Pass:     r.Failed == 0,
			})
		}
	}
	return gs
}

func metMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func markdownNodeEnv(w func(string, ...any), e nodeEnv) {
	w("Cluster: %d nodes of e2e/cluster on this machine (each node's containerd and kubelet in a network namespace of its own, sharing the CPUs, the disk and %s MiB of memory, %s MiB available at the start); kubelet %s, containerd %s, runc %s, CRIU %s.\n",
		e.Nodes, thousands(float64(e.MemTotalMiB)), thousands(float64(e.MemAvailableMiB)), lastWord(e.Kubelet), lastWord(e.Containerd), lastWord(e.Runc), lastWord(e.CRIU))
}

// lastWord is the version at the end of a --version line ("runc version
// 1.1.5+ds1" → "1.1.5+ds1"), or "?".
func lastWord(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return "?"
	}
	return f[len(f)-1]
}

// fmtMs0 formats milliseconds without decimals.
func fmtMs0(v float64) string { return thousands(v) }

// fmtMs1 formats milliseconds with one decimal.
func fmtMs1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// pct2 formats a ratio as a percentage with two decimals.
func pct2(r float64) string { return fmt.Sprintf("%.2f%%", r*100) }

func markdownCRIU(w func(string, ...any), c *criuResult) {
	w("\n#### Checkpoint and restore against resident memory\n\n")
	markdownNodeEnv(w, c.Env)
	w("\nMethod: hack/bench/ballast, a static Go program that writes pseudo-random bytes over BALLAST_MB MiB, prints its VmRSS and sleeps. ")
	w("Cluster: the ballast as a pod on node 1 from an image in the cluster's registry; `migrate.Checkpoint` (the kubelet's checkpoint API through the API server's node proxy), timed; `ociimage.Checkpoint` and `ociimage.Push` of the archive to the cluster's registry, timed; the app's own image pulled on node 2 (as the migrator does; not in the restore time); then a new pod on node 2 whose image is the checkpoint image by digest, timed from the create call until the API server shows it Running (watched: this includes the kubelet's pull of the checkpoint image, containerd's restore-via-create, CRIU's restore, and the kubelet's status update). ")
	w("Host: the same binary started with setsid(2), stdin /dev/null and stdout/stderr to a file of its own; `criu dump -t PID --network-lock nftables` into a folder on the same disk, timed (the dump kills it); once its PID is gone, `criu restore -d`, timed (it returns once the restored process runs); then the restored process is stopped. ")
	w("%d round(s) per size; %s; medians of the rounds.\n\n", c.Rounds, c.Order)
	for _, note := range c.Notes {
		w("- %s\n", note)
	}
	if len(c.Notes) > 0 {
		w("\n")
	}
	w("| Ballast (MiB) | RSS (MiB) | Cluster: checkpoint (ms) | Archive (MiB) | Image build + push (ms) | Image (MiB) | Restore, create → Running (ms) | Host: CRIU dump (ms) | Dump images (MiB) | CRIU restore (ms) | Checkpoint / dump | Restore / restore |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range c.Sizes {
		w("| %d | %.1f | %s | %.1f | %s | %.1f | %s | %s | %.1f | %s | %s | %s |\n",
			s.BallastMiB, s.PodRSSMiB, fmtMs0(s.PodCheckpointMs), s.PodArchiveMiB, fmtMs0(s.PodImageMs), s.PodImageMiB, fmtMs0(s.PodRestoreMs),
			fmtMs0(s.HostDumpMs), s.HostDumpMiB, fmtMs0(s.HostRestoreMs), ratio(s.PodCheckpointMs, s.HostDumpMs), ratio(s.PodRestoreMs, s.HostRestoreMs))
	}
	w("\nWhere the cluster's time goes, from the nodes' containerd logs (medians, ms). Checkpoint: from the call until containerd holds the dump as a checkpoint image in its content store (API server and kubelet hops, runc checkpoint with CRIU's dump, the dump written into the content store); then until containerd has written the archive for the kubelet; then until the call returned. Restore: the pod sandbox; the checkpoint image's pull; CreateContainer (containerd unpacks the checkpoint for the restore); StartContainer (runc restore with CRIU); then until the API server showed the pod Running.\n\n")
	w("| Ballast (MiB) | Dump into containerd | Archive written | Reply | Sandbox | Checkpoint image pull | CreateContainer | StartContainer (CRIU restore) | Status |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range c.Sizes {
		cells := []string{"–", "–", "–", "–", "–", "–", "–", "–"}
		if cp := s.PodCheckpointSteps; cp != nil {
			cells[0], cells[1], cells[2] = fmtMs0(cp.ToImageMs), fmtMs0(cp.ArchiveMs), fmtMs0(cp.ReplyMs)
		}
		if r := s.PodRestoreSteps; r != nil {
			cells[3], cells[4], cells[5], cells[6], cells[7] = fmtMs0(r.SandboxMs), fmtMs0(r.PullMs), fmtMs0(r.CreateMs), fmtMs0(r.StartMs), fmtMs0(r.StatusMs)
		}
		w("| %d | %s |\n", s.BallastMiB, strings.Join(cells, " | "))
	}
	w("\nPer round, in run order (ms):\n\n")
	for _, s := range c.Sizes {
		var pod, host []string
		for _, p := range s.Pod {
			pod = append(pod, fmt.Sprintf("%s / %s / %s (base pull %s)", fmtMs0(p.CheckpointMs), fmtMs0(p.ImageMs), fmtMs0(p.RestoreMs), fmtMs0(p.BasePullMs)))
		}
		for _, h := range s.Host {
			host = append(host, fmt.Sprintf("%s / %s", fmtMs0(h.DumpMs), fmtMs0(h.RestoreMs)))
		}
		w("- %d MiB: cluster checkpoint / image / restore %s; host dump / restore %s\n", s.BallastMiB, strings.Join(pod, "; "), strings.Join(host, "; "))
	}
}

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f×", a/b)
}

func markdownStrategies(w func(string, ...any), s *strategiesResult) {
	w("\n#### ms2m against stop-and-copy on real nodes\n\n")
	markdownNodeEnv(w, s.Env)
	w("\nMethod: per migration, a fresh examples/consumer pod (Go, prefetch %d, %d ms of work per message: μ = %d msg/s) on node 1 with the sidecar injected as the webhook would, its own durable queue, and examples/producer on the host publishing at λ for %gs in all. ",
		s.Prefetch, s.WorkMs, strategyServiceRate, s.ProducerSeconds)
	w("%gs after the consumer processed its first message, `migrate.Run` moves it to node 2 (the same call as e2e/migrate_test.go). **Downtime is the processing gap**: the longest interval overlapping the migration in which no consumer finished a message while one was waiting, from the consumers' journals (GET /folds), which includes the checkpoint's freeze and the work on the message in hand. The switch time is `Report.Downtime`: for ms2m the handover's (from the start of the source's stop until the broker confirmed the target's consume of the primary queue); for stop-and-copy from the start of the source's stop until the target's sidecar switched to the primary queue; it leaves the freeze out. Total is the whole `migrate.Run`. ",
		s.WarmupSeconds)
	w("After the producer is done, the target's hash chain is compared with the producer's; a mismatch, a skipped redelivery or a failed migration is an error and its round is left out of the figures. %d round(s); %s. The processing gap as mean / median / p95 (nearest rank); the rest are medians; the goal is judged on the switch time.\n\n", s.Rounds, s.Order)
	w("| λ (msg/s) | ms2m downtime: processing gap (ms) | stop-and-copy processing gap (ms) | ms2m switch time (ms) | stop-and-copy switch time (ms) | ms2m / stop-and-copy switch | ms2m total (s) | stop-and-copy total (s) | Failed | Goal | Result |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range s.Rates {
		w("| %g | %s | %s | %s | %s | %s | %.2f | %.2f | %d of %d | ms2m switch ≤ %g%% of stop-and-copy's, all exact | %s |\n",
			r.RateMsgsPerSec, spreadCell(r.MS2MGap), spreadCell(r.SCGap), fmtMs1(r.MS2MDowntimeMs), fmtMs1(r.SCDowntimeMs), pct2(r.DowntimeRatio), r.MS2MTotalMs/1000, r.SCTotalMs/1000,
			r.Failed, len(r.MS2M)+len(r.StopAndCopy), goalDowntimeRatio*100, metMissed(r.GoalMet))
	}
	for _, st := range []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy} {
		var names []string
		for _, r := range s.Rates {
			for _, p := range phasesOf(r, st) {
				if !slices.Contains(names, p.Name) {
					names = append(names, p.Name)
				}
			}
		}
		if len(names) == 0 {
			continue
		}
		w("\nPhases of %s, medians (ms):\n\n", st)
		w("| λ (msg/s) | %s |\n", strings.Join(names, " | "))
		w("|---:|%s\n", strings.Repeat("---:|", len(names)))
		for _, r := range s.Rates {
			cells := make([]string, len(names))
			for i, name := range names {
				cells[i] = "–"
				for _, p := range phasesOf(r, st) {
					if p.Name == name {
						cells[i] = fmtMs1(p.MedianMs)
					}
				}
			}
			w("| %g | %s |\n", r.RateMsgsPerSec, strings.Join(cells, " | "))
		}
	}
	w("\nPer migration, by round: processing gap / switch time / total in ms (messages the source had processed when it started; whether it ran first in its pair):\n\n")
	for _, r := range s.Rates {
		for _, st := range []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy} {
			rounds := r.MS2M
			if st == contract.StrategyStopAndCopy {
				rounds = r.StopAndCopy
			}
			parts := make([]string, len(rounds))
			for i, m := range rounds {
				order := "second"
				if m.First {
					order = "first"
				}
				gap := "?"
				if m.ProcessingGapMs != nil {
					gap = fmtMs1(*m.ProcessingGapMs)
				}
				parts[i] = fmt.Sprintf("%s / %s / %s (%d, %s)", gap, fmtMs1(m.SwitchMs), fmtMs1(m.TotalMs), m.CountAtStart, order)
				if !m.ok() {
					parts[i] += " **ERROR: " + m.Error + "**"
				}
			}
			w("- λ = %g, %s: %s\n", r.RateMsgsPerSec, st, strings.Join(parts, "; "))
		}
	}
}

func phasesOf(r strategyRate, s contract.Strategy) []phaseMedian {
	if s == contract.StrategyMS2M {
		return r.MS2MPhases
	}
	return r.SCPhases
}
