package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/ociimage"
)

const (
	// bigBallastMB and up is a big size: it runs only when the machine has
	// more than bigNeedsGiB available, or with -criu-big. A round holds the
	// ballast twice (the source pod and its restored copy), and the archive,
	// the registry's copy and the target's copy of the checkpoint in the
	// page cache.
	bigBallastMB = 512
	bigNeedsGiB  = 4

	ballastContainer = "ballast"
	// ballastRepo is where the criu part pushes checkpoint images, below
	// the cluster's registry.
	ballastRepo = "ms2m/bench-ballast-checkpoints"
	// criuTimeout bounds each step of a round: a checkpoint, a restore, a
	// wait for the app to be ready.
	criuTimeout = 5 * time.Minute
)

// criuResult is the criu part: per ballast size, checkpoint and restore on
// the cluster beside raw CRIU on the host.
type criuResult struct {
	Rounds int     `json:"rounds"`
	Order  string  `json:"order"`
	Env    nodeEnv `json:"env"`
	// Notes say which sizes ran or were skipped, and why.
	Notes []string   `json:"notes"`
	Sizes []criuSize `json:"sizes"`
}

type criuSize struct {
	BallastMiB int `json:"ballastMiB"`
	// Medians of the rounds.
	PodRSSMiB          float64 `json:"podRssMiB"`
	PodCheckpointMs    float64 `json:"podCheckpointMs"`
	PodArchiveMiB      float64 `json:"podArchiveMiB"`
	PodImageMs         float64 `json:"podImageMs"`
	PodImageMiB        float64 `json:"podImageMiB"`
	PodRestoreMs       float64 `json:"podRestoreMs"`
	HostRSSMiB         float64 `json:"hostRssMiB"`
	HostDumpMs         float64 `json:"hostDumpMs"`
	HostDumpMiB        float64 `json:"hostDumpMiB"`
	HostRestoreMs      float64 `json:"hostRestoreMs"`
	HostRestoredRSSMiB float64 `json:"hostRestoredRssMiB"`
	// Medians of the steps, over the rounds whose steps were found.
	PodCheckpointSteps *checkpointSteps `json:"podCheckpointSteps"`
	PodRestoreSteps    *restoreSteps    `json:"podRestoreSteps"`

	Pod  []podCRIURound  `json:"pod"`
	Host []hostCRIURound `json:"host"`
}

// podCRIURound is one checkpoint and restore on the cluster.
type podCRIURound struct {
	Round int  `json:"round"`
	First bool `json:"ranFirst"` // before the host round of the same round
	// RSSKiB is what the ballast in the pod reported once it was ready.
	RSSKiB int `json:"rssKiB"`
	// CheckpointMs is migrate.Checkpoint: the kubelet's checkpoint API
	// through the API server's node proxy (CRIU dump by runc, then the
	// archive written by containerd).
	CheckpointMs float64 `json:"checkpointMs"`
	ArchiveBytes int64   `json:"archiveBytes"`
	// ImageMs is ociimage.Checkpoint (hashing the archive) and
	// ociimage.Push to the cluster's registry; ImageBytes the image's
	// manifest, config and layer.
	ImageMs    float64 `json:"imageMs"`
	ImageBytes int64   `json:"imageBytes"`
	// BasePullMs is pulling the app's own image on the target node, which
	// a restore needs first (present after the first round).
	BasePullMs float64 `json:"basePullMs"`
	// RestoreMs is from the create call of the restored pod on node 2 to
	// the API server showing it Running: the checkpoint image's pull,
	// containerd's restore-via-create and CRIU's restore.
	RestoreMs float64 `json:"restoreMs"`
	// Where the time went, from the nodes' containerd logs; nil where a
	// log line was not found.
	CheckpointSteps *checkpointSteps `json:"checkpointSteps"`
	RestoreSteps    *restoreSteps    `json:"restoreSteps"`
}

// checkpointSteps split CheckpointMs by node 1's containerd log.
type checkpointSteps struct {
	// ToImageMs is from the call until containerd has the checkpoint as
	// an image in its content store: the API server and kubelet hops,
	// runc's checkpoint with CRIU's dump, and writing the dump into the
	// content store.
	ToImageMs float64 `json:"toContainerdImageMs"`
	// ArchiveMs is from there until the archive for the kubelet is
	// written, ReplyMs from there until the call returned.
	ArchiveMs float64 `json:"archiveMs"`
	ReplyMs   float64 `json:"replyMs"`
}

// restoreSteps split RestoreMs by node 2's containerd log.
type restoreSteps struct {
	SandboxMs float64 `json:"sandboxMs"` // from the create call until the pod sandbox runs
	PullMs    float64 `json:"pullMs"`    // the checkpoint image's pull
	CreateMs  float64 `json:"createMs"`  // CreateContainer: the checkpoint unpacked for the restore
	StartMs   float64 `json:"startMs"`   // StartContainer: runc restore with CRIU
	StatusMs  float64 `json:"statusMs"`  // until the API server showed the pod Running
}

// hostCRIURound is one raw CRIU dump and restore of the same binary on the
// host.
type hostCRIURound struct {
	Round     int     `json:"round"`
	First     bool    `json:"ranFirst"`
	RSSKiB    int     `json:"rssKiB"`
	DumpMs    float64 `json:"dumpMs"` // `criu dump`, wall clock of the command
	DumpBytes int64   `json:"dumpBytes"`
	// RestoreMs is `criu restore -d`, wall clock of the command: it returns
	// once the restored process runs.
	RestoreMs          float64 `json:"restoreMs"`
	RestoredRSSKiB     int     `json:"restoredRssKiB"`
	WaitedForPIDGoneMs float64 `json:"waitedForPidGoneMs"` // between the dump and the restore
}

// criu runs the criu part.
func (n *nodeLab) criu(ctx context.Context) (*criuResult, error) {
	res := &criuResult{
		Rounds: n.o.criuRounds,
		Order:  "per round, each size in turn; within a size the cluster and the host take turns going first",
	}
	_, avail := meminfoMiB()
	var sizes []int
	for _, mb := range n.o.criuMB {
		switch {
		case mb < bigBallastMB:
			sizes = append(sizes, mb)
		case n.o.criuBig:
			sizes = append(sizes, mb)
			res.Notes = append(res.Notes, fmt.Sprintf("%d MiB ran because -criu-big was given (%d MiB available at the start).", mb, avail))
		case avail > bigNeedsGiB<<10:
			sizes = append(sizes, mb)
			res.Notes = append(res.Notes, fmt.Sprintf("%d MiB ran because the machine had %.1f GiB available at the start (more than %d GiB; -criu-big runs it regardless).", mb, float64(avail)/1024, bigNeedsGiB))
		default:
			res.Notes = append(res.Notes, fmt.Sprintf("%d MiB was skipped: the machine had only %.1f GiB available (it needs more than %d GiB, or -criu-big).", mb, float64(avail)/1024, bigNeedsGiB))
			progress("criu: skipping a big ballast", "mib", mb, "available_gib", fmt.Sprintf("%.1f", float64(avail)/1024), "need_gib", bigNeedsGiB, "override", "-criu-big")
		}
	}

	l, err := n.get(ctx)
	if err != nil {
		return nil, err
	}
	res.Env = *n.env
	bin, err := n.binary("hack/bench/ballast")
	if err != nil {
		return nil, err
	}
	img, err := ociimage.App(ociimage.AppOptions{Binaries: []string{bin}, User: "0:0"})
	if err != nil {
		return nil, fmt.Errorf("ballast image: %w", err)
	}
	ref := l.Cluster.RegistryAddr() + "/ms2m/bench-ballast:bench"
	if err := ociimage.Push(ctx, img, ref, ociimage.PushOptions{Insecure: true}); err != nil {
		return nil, err
	}

	for _, mb := range sizes {
		res.Sizes = append(res.Sizes, criuSize{BallastMiB: mb})
	}
	for r := 1; r <= n.o.criuRounds; r++ {
		for i, mb := range sizes {
			podFirst := (r+i)%2 == 1
			s := &res.Sizes[i]
			for _, onPod := range []bool{podFirst, !podFirst} {
				if onPod {
					progress("criu: on the cluster", "ballast_mib", mb, "round", fmt.Sprintf("%d/%d", r, n.o.criuRounds))
					pr, err := n.podRound(ctx, l, ref, mb)
					if err != nil {
						return nil, fmt.Errorf("criu part, %d MiB, round %d, on the cluster: %w", mb, r, err)
					}
					pr.Round, pr.First = r, podFirst
					progress("  done", "rss_mib", mib(int64(pr.RSSKiB)<<10), "checkpoint_ms", fmtMs(pr.CheckpointMs), "archive_mib", mib(pr.ArchiveBytes),
						"image_ms", fmtMs(pr.ImageMs), "image_mib", mib(pr.ImageBytes), "base_pull_ms", fmtMs(pr.BasePullMs), "restore_ms", fmtMs(pr.RestoreMs))
					s.Pod = append(s.Pod, pr)
				} else {
					progress("criu: raw CRIU on the host", "ballast_mib", mb, "round", fmt.Sprintf("%d/%d", r, n.o.criuRounds))
					hr, err := n.hostRound(ctx, bin, mb)
					if err != nil {
						return nil, fmt.Errorf("criu part, %d MiB, round %d, raw CRIU: %w", mb, r, err)
					}
					hr.Round, hr.First = r, !podFirst
					progress("  done", "rss_mib", mib(int64(hr.RSSKiB)<<10), "dump_ms", fmtMs(hr.DumpMs), "dump_mib", mib(hr.DumpBytes),
						"restore_ms", fmtMs(hr.RestoreMs), "restored_rss_mib", mib(int64(hr.RestoredRSSKiB)<<10))
					s.Host = append(s.Host, hr)
				}
			}
		}
	}
	for i := range res.Sizes {
		res.Sizes[i].summarise()
	}
	return res, nil
}

func (s *criuSize) summarise() {
	var rss, cp, arch, im, imb, rest []float64
	for _, p := range s.Pod {
		rss, cp, arch = append(rss, float64(p.RSSKiB)/1024), append(cp, p.CheckpointMs), append(arch, float64(p.ArchiveBytes)/(1<<20))
		im, imb, rest = append(im, p.ImageMs), append(imb, float64(p.ImageBytes)/(1<<20)), append(rest, p.RestoreMs)
	}
	s.PodRSSMiB, s.PodCheckpointMs, s.PodArchiveMiB = median(rss), median(cp), median(arch)
	s.PodImageMs, s.PodImageMiB, s.PodRestoreMs = median(im), median(imb), median(rest)
	var toImage, archive, reply, sandbox, pull, create, start, status []float64
	for _, p := range s.Pod {
		if c := p.CheckpointSteps; c != nil {
			toImage, archive, reply = append(toImage, c.ToImageMs), append(archive, c.ArchiveMs), append(reply, c.ReplyMs)
		}
		if r := p.RestoreSteps; r != nil {
			sandbox, pull, create = append(sandbox, r.SandboxMs), append(pull, r.PullMs), append(create, r.CreateMs)
			start, status = append(start, r.StartMs), append(status, r.StatusMs)
		}
	}
	if len(toImage) > 0 {
		s.PodCheckpointSteps = &checkpointSteps{ToImageMs: median(toImage), ArchiveMs: median(archive), ReplyMs: median(reply)}
	}
	if len(sandbox) > 0 {
		s.PodRestoreSteps = &restoreSteps{SandboxMs: median(sandbox), PullMs: median(pull), CreateMs: median(create), StartMs: median(start), StatusMs: median(status)}
	}
	var hrss, dump, dumpb, hrest, rrss []float64
	for _, h := range s.Host {
		hrss, dump, dumpb = append(hrss, float64(h.RSSKiB)/1024), append(dump, h.DumpMs), append(dumpb, float64(h.DumpBytes)/(1<<20))
		hrest, rrss = append(hrest, h.RestoreMs), append(rrss, float64(h.RestoredRSSKiB)/1024)
	}
	s.HostRSSMiB, s.HostDumpMs, s.HostDumpMiB, s.HostRestoreMs, s.HostRestoredRSSMiB = median(hrss), median(dump), median(dumpb), median(hrest), median(rrss)
}

// podRound runs the ballast in a pod on node 1, checkpoints it through the
// kubelet, builds and pushes the checkpoint image, and restores it as a new
// pod on node 2. It deletes both pods, the archive and the checkpoint
// image's copies before it returns.
func (n *nodeLab) podRound(ctx context.Context, l *lab.Lab, ref string, mb int) (podCRIURound, error) {
	var r podCRIURound
	cs := l.Client
	podName := uniqueName(fmt.Sprintf("ballast-%d", mb))
	restoredName := podName + "-restored"
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := l.DeletePods(cctx, podName, restoredName); err != nil {
			progress("  could not delete the ballast pods", "err", err)
		}
		removeNodeImages(cctx, l, 2, ballastRepo)
	}()

	grace, root := int64(1), int64(0)
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{
			NodeName:                      cluster.NodeName(1),
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:  ballastContainer,
				Image: ref,
				Env:   []corev1.EnvVar{{Name: "BALLAST_MB", Value: strconv.Itoa(mb)}},
				// As in the lab: CRIU reads the rlimits of what it dumps,
				// which takes the same uid or CAP_SYS_RESOURCE.
				SecurityContext: &corev1.SecurityContext{RunAsUser: &root, RunAsGroup: &root},
			}},
		},
	}
	pod.Name, pod.Namespace = podName, lab.Namespace
	src, _, err := createAndWaitRunning(ctx, cs, pod, criuTimeout)
	if err != nil {
		return r, err
	}
	if r.RSSKiB, err = podReady(ctx, l, podName); err != nil {
		return r, err
	}

	t0 := time.Now()
	archive, err := migrate.Checkpoint(ctx, cs.CoreV1().RESTClient(), cluster.NodeName(1), lab.Namespace, podName, ballastContainer, criuTimeout)
	if err != nil {
		return r, err
	}
	r.CheckpointMs = ms(time.Since(t0))
	if ts := containerdLogTimes(l, 1, t0,
		[]string{`ImageCreate event name:\"containerd.io/checkpoint/`},
		[]string{"Wrote checkpoint archive to " + archive}); ts != nil {
		r.CheckpointSteps = &checkpointSteps{ToImageMs: ms(ts[0].Sub(t0)), ArchiveMs: ms(ts[1].Sub(ts[0])), ReplyMs: r.CheckpointMs - ms(ts[1].Sub(t0))}
	}
	defer os.Remove(archive)
	st, err := os.Stat(archive)
	if err != nil {
		return r, fmt.Errorf("the checkpoint archive: %w", err)
	}
	r.ArchiveBytes = st.Size()

	t0 = time.Now()
	img, err := ociimage.Checkpoint(archive, ballastContainer)
	if err != nil {
		return r, err
	}
	tag := l.Cluster.RegistryAddr() + "/" + ballastRepo + ":" + podName
	if err := ociimage.Push(ctx, img, tag, ociimage.PushOptions{Insecure: true}); err != nil {
		return r, err
	}
	r.ImageMs = ms(time.Since(t0))
	digest, err := img.Digest()
	if err != nil {
		return r, err
	}
	m, err := img.Manifest()
	if err != nil {
		return r, err
	}
	raw, _ := img.RawManifest()
	r.ImageBytes = int64(len(raw)) + m.Config.Size
	for _, layer := range m.Layers {
		r.ImageBytes += layer.Size
		// The registry's copy goes with the round; the manifest that
		// names it is not pulled again.
		defer os.Remove(filepath.Join(l.Cluster.StateDir(), "registry", "blobs", layer.Digest.Algorithm, layer.Digest.Hex))
	}
	t, err := name.NewTag(tag, name.Insecure)
	if err != nil {
		return r, err
	}
	checkpointRef := t.Context().Digest(digest.String()).String()

	// The restore needs the app's own image on the target, and pulls it
	// without the node's registry configuration: pull it ahead, as the
	// migrator does.
	t0 = time.Now()
	if err := l.Agent().PullImage(ctx, cluster.NodeName(2), containerImage(src, ballastContainer), nil); err != nil {
		return r, err
	}
	r.BasePullMs = ms(time.Since(t0))

	restored := pod.DeepCopy()
	restored.Name = restoredName
	restored.Spec.NodeName = cluster.NodeName(2)
	restored.Spec.Containers[0].Image = checkpointRef
	t0 = time.Now()
	_, took, err := createAndWaitRunning(ctx, cs, restored, criuTimeout)
	if err != nil {
		return r, fmt.Errorf("restore %s on %s: %w", checkpointRef, cluster.NodeName(2), err)
	}
	r.RestoreMs = ms(took)
	// Only this pod is being created on node 2, so the first
	// CreateContainer and StartContainer after the pull are its.
	if ts := containerdLogTimes(l, 2, t0,
		[]string{`RunPodSandbox for name:\"` + restoredName + `\"`, "returns sandbox id"},
		[]string{`Pulled image \"` + checkpointRef + `\"`},
		[]string{"CreateContainer within sandbox", "returns container id"},
		[]string{"StartContainer for", "returns successfully"}); ts != nil {
		r.RestoreSteps = &restoreSteps{
			SandboxMs: ms(ts[0].Sub(t0)), PullMs: ms(ts[1].Sub(ts[0])), CreateMs: ms(ts[2].Sub(ts[1])),
			StartMs: ms(ts[3].Sub(ts[2])), StatusMs: r.RestoreMs - ms(ts[3].Sub(t0)),
		}
	}
	return r, nil
}

// containerdLogTimes reads node i's containerd log, at the cluster's
// layout (STATE/logs/<node>-containerd.log), and returns markerTimes of it.
// Its times are the host's clock, as the bench's are.
func containerdLogTimes(l *lab.Lab, i int, since time.Time, markers ...[]string) []time.Time {
	b, err := os.ReadFile(filepath.Join(l.Cluster.StateDir(), "logs", cluster.NodeName(i)+"-containerd.log"))
	if err != nil {
		return nil
	}
	return markerTimes(string(b), since, markers...)
}

// markerTimes returns, for each marker in turn, the time of the first line
// of a containerd log (time="RFC 3339" ...) at or after since, and after
// the previous marker's line, that contains all of the marker's strings;
// nil if one is missing.
func markerTimes(log string, since time.Time, markers ...[]string) []time.Time {
	var ts []time.Time
	after := since
	for line := range strings.Lines(log) {
		if len(ts) == len(markers) {
			break
		}
		stamp, ok := strings.CutPrefix(line, `time="`)
		if !ok {
			continue
		}
		stamp, _, _ = strings.Cut(stamp, `"`)
		t, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil || t.Before(after) {
			continue
		}
		all := true
		for _, m := range markers[len(ts)] {
			all = all && strings.Contains(line, m)
		}
		if all {
			ts = append(ts, t)
			after = t
		}
	}
	if len(ts) < len(markers) {
		return nil
	}
	return ts
}

// podReady waits for the ballast in pod to print "ready", and returns the
// resident set it reported.
func podReady(ctx context.Context, l *lab.Lab, pod string) (int, error) {
	deadline := time.Now().Add(criuTimeout)
	var last string
	for time.Now().Before(deadline) {
		b, err := l.Client.CoreV1().Pods(lab.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: ballastContainer}).DoRaw(ctx)
		if err == nil {
			last = string(b)
			if rss, ok := parseBallast(last); ok {
				return rss, nil
			}
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("the ballast in pod %s did not print ready within %s; its log: %q", pod, criuTimeout, last)
}

// parseBallast reads the ballast's output: its resident set, once it has
// printed "ready".
func parseBallast(out string) (rssKiB int, ready bool) {
	rssKiB = -1
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if line == "ready" {
			ready = true
		}
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "rss_kib="); ok {
				rssKiB, _ = strconv.Atoi(v)
			}
		}
	}
	return rssKiB, ready
}

// hostRound runs the ballast binary on the host in a session of its own
// with stdio files of its own, dumps it with CRIU (which kills it), waits
// for its PID to be gone, restores it detached, then stops the restored
// process.
func (n *nodeLab) hostRound(ctx context.Context, bin string, mb int) (hostCRIURound, error) {
	var r hostCRIURound
	criu := filepath.Join(n.opts.BinDir, "criu", "criu")
	dir, err := os.MkdirTemp("", "ms2m-bench-criu-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	images := filepath.Join(dir, "images")
	if err := os.Mkdir(images, 0o700); err != nil {
		return r, err
	}
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		return r, err
	}
	defer stdin.Close()
	outPath := filepath.Join(dir, "ballast.out")
	out, err := os.Create(outPath)
	if err != nil {
		return r, err
	}
	defer out.Close()

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "BALLAST_MB="+strconv.Itoa(mb))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // setsid(2): CRIU dumps a session leader without --shell-job
	if err := cmd.Start(); err != nil {
		return r, fmt.Errorf("start %s: %w", bin, err)
	}
	pid := cmd.Process.Pid
	dumped := false
	defer func() {
		if !dumped {
			cmd.Process.Kill()
			_ = cmd.Wait() // "signal: killed": reaped, nothing more to learn
		}
	}()

	deadline := time.Now().Add(criuTimeout)
	for {
		b, _ := os.ReadFile(outPath)
		if _, ready := parseBallast(string(b)); ready {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the ballast (pid %d) did not print ready within %s: %q", pid, criuTimeout, b)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return r, err
		}
	}
	r.RSSKiB = procRSSKiB(pid)

	dumpLog := filepath.Join(dir, "dump.log")
	cctx, cancel := context.WithTimeout(ctx, criuTimeout)
	defer cancel()
	t0 := time.Now()
	err = exec.CommandContext(cctx, criu, "dump", "-t", strconv.Itoa(pid), "-D", images, "--network-lock", "nftables", "-o", dumpLog).Run()
	r.DumpMs = ms(time.Since(t0))
	if err != nil {
		return r, fmt.Errorf("criu dump -t %d: %w; %s", pid, err, logTail(dumpLog))
	}
	// The dump killed it; reaping it frees the PID for the restore.
	dumped = true
	t0 = time.Now()
	_ = cmd.Wait() // the dump killed it, so it ends in an error by design
	if !waitPIDGone(pid, 10*time.Second) {
		return r, fmt.Errorf("pid %d still exists after the dump", pid)
	}
	r.WaitedForPIDGoneMs = ms(time.Since(t0))
	r.DumpBytes = treeSize(images)

	restoreLog, pidFile := filepath.Join(dir, "restore.log"), filepath.Join(dir, "restored.pid")
	t0 = time.Now()
	err = exec.CommandContext(cctx, criu, "restore", "-d", "-D", images, "-o", restoreLog, "--pidfile", pidFile).Run()
	r.RestoreMs = ms(time.Since(t0))
	if err != nil {
		return r, fmt.Errorf("criu restore: %w; %s", err, logTail(restoreLog))
	}
	b, _ := os.ReadFile(pidFile)
	restored, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return r, fmt.Errorf("criu restore wrote pid file %q: %w", b, err)
	}
	r.RestoredRSSKiB = procRSSKiB(restored)
	// The restored process belongs to init now: stop it, and wait until
	// init has reaped it.
	// A kill fails only if the pid is gone, which the waits look for.
	_ = syscall.Kill(restored, syscall.SIGTERM)
	if !waitPIDGone(restored, 10*time.Second) {
		_ = syscall.Kill(restored, syscall.SIGKILL)
		if !waitPIDGone(restored, 10*time.Second) {
			return r, fmt.Errorf("the restored ballast (pid %d) did not exit", restored)
		}
	}
	if restored != pid {
		return r, fmt.Errorf("criu restored pid %d as %d", pid, restored)
	}
	return r, nil
}

// procRSSKiB is VmRSS of pid, or -1.
func procRSSKiB(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// waitPIDGone waits until pid no longer exists (a zombie counts as
// existing: its PID is not free).
func waitPIDGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// treeSize is the total size of the regular files under dir.
func treeSize(dir string) int64 {
	var n int64
	// The walk function never fails, so neither does the walk.
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// logTail is the last lines of a CRIU log, for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log at " + path
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return "the end of " + filepath.Base(path) + ":\n" + strings.Join(lines[max(0, len(lines)-8):], "\n")
}

// mib formats bytes as MiB with one decimal.
func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
