package migrate

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// Parts splits a copy migration's checkpoint and restore phases (ms2m,
// ms2m-cutoff, stop-and-copy, criu-alone) into what the real components
// report about them (Report.Parts). A part that could not be measured is
// zero and Unmeasured says why; nothing is estimated.
type Parts struct {
	// Call is the kubelet's checkpoint call, whole. CRIUDump is how long
	// CRIU held the app's tasks within it, as the node's agent saw it
	// (its dump watch); the rest of the call (CallRest) is the runtime's
	// work around the dump: the kubelet's and containerd's hops, runc's
	// and CRIU's setup, the root filesystem's diff and the archive.
	Call     time.Duration `json:"checkpointCall,omitempty"`
	CRIUDump time.Duration `json:"criuDump,omitempty"`
	// Image is building the checkpoint image from the archive and
	// pushing it, by the source node's agent.
	Image time.Duration `json:"imageBuildPush,omitempty"`
	// Restore is from the target pod's create call until it ran with
	// every container ready. Pull is the kubelet's pull of the checkpoint
	// image in it (its Pulled Event); CRIURestore is CRIU's restore, the
	// last timestamp of its restore.log (CRIU stamps each line with the
	// time since it started). The rest (RestoreRest) is the pod's
	// scheduling and sandbox, the sidecar's start, containerd's unpacking
	// of the checkpoint, runc's work around CRIU and the readiness probes.
	Restore     time.Duration `json:"restore,omitempty"`
	Pull        time.Duration `json:"checkpointImagePull,omitempty"`
	CRIURestore time.Duration `json:"criuRestore,omitempty"`
	// PulledAhead is the target node's agent's pull of the checkpoint
	// image when Plan.PullAhead asked for it, started with the target
	// pod's creation (Pull is then the kubelet's, mostly finding it
	// there); PullAheadFailed says why it failed (the kubelet pulled it).
	PulledAhead     time.Duration `json:"pulledAhead,omitempty"`
	PullAheadFailed string        `json:"pullAheadFailed,omitempty"`
	// Unmeasured are the parts that could not be measured, each as
	// "part: why".
	Unmeasured []string `json:"unmeasured,omitempty"`
}

// The names of the parts that may be unmeasured.
const (
	PartCRIUDump    = "CRIU dump"
	PartPull        = "checkpoint image pull"
	PartCRIURestore = "CRIU restore"
)

// CallRest is the checkpoint call's time outside CRIU's dump; false when
// either is unmeasured.
func (p Parts) CallRest() (time.Duration, bool) {
	if p.Call <= 0 || p.CRIUDump <= 0 {
		return 0, false
	}
	return max(p.Call-p.CRIUDump, 0), true
}

// RestoreRest is the restore phase's time outside the pull and CRIU's
// restore; false when either is unmeasured.
func (p Parts) RestoreRest() (time.Duration, bool) {
	if p.Restore <= 0 || p.CRIURestore <= 0 || p.Pull < 0 || p.unmeasured(PartPull) {
		return 0, false
	}
	return max(p.Restore-p.Pull-p.CRIURestore, 0), true
}

func (p Parts) unmeasured(part string) bool {
	for _, u := range p.Unmeasured {
		if strings.HasPrefix(u, part+": ") {
			return true
		}
	}
	return false
}

func (p *Parts) miss(part, why string) { p.Unmeasured = append(p.Unmeasured, part+": "+why) }

// partsOf fills the parts that rep's phases and hold already hold: the
// checkpoint call (the hold's, or the checkpoint phase's, which is the
// call alone), CRIU's dump as the hold's dump watch saw it, the image and
// the restore phases. dump is a stop-and-copy's own dump watch (zero:
// none; noDump says why).
func partsOf(rep Report, dump time.Duration, noDump string) Parts {
	var p Parts
	took := map[string]time.Duration{}
	for _, ph := range rep.Phases {
		took[ph.Name] += ph.Took
	}
	p.Call, p.Image, p.Restore = took["checkpoint"], took["image"], took["restore"]
	switch h := rep.Hold; {
	case h != nil:
		p.Call = h.Call
		switch {
		case h.CRIU > 0:
			p.CRIUDump = h.CRIU
		case h.ThawFallback != "":
			p.miss(PartCRIUDump, "the dump watch did not run: "+h.ThawFallback)
		default:
			p.miss(PartCRIUDump, "the node's agent saw no dump")
		}
	case dump > 0:
		p.CRIUDump = dump
	default:
		if noDump == "" {
			noDump = "the node's agent saw no dump"
		}
		p.miss(PartCRIUDump, noDump)
	}
	return p
}

// dumpGrace bounds how long a checkpoint waits, once its call has
// returned, for the dump watch's answer: the dump is over by then, and
// the agent answers within its next poll.
const dumpGrace = time.Second

// watchCRIU starts the node agent's watch for CRIU's dump of pod's app
// container, only watching (nothing is thawed). seen, called once the
// checkpoint call has returned, says how long CRIU held the app's tasks,
// or why that is not known; stop ends the watch (deferred by the caller,
// also on a failed call).
func (r *run) watchCRIU(ctx context.Context, pod *corev1.Pod) (seen func() (time.Duration, string), stop func()) {
	no := func(why string) (func() (time.Duration, string), func()) {
		return func() (time.Duration, string) { return 0, why }, func() {}
	}
	dw, ok := r.env.Agent.(DumpWatcher)
	id := containerID(pod, r.p.Container)
	switch {
	case !ok:
		return no("the node agent cannot watch for the dump")
	case id == "":
		return no("the app container has no ID in the pod's status")
	}
	wctx, cancel := context.WithCancel(ctx)
	wait, err := dw.WatchDump(wctx, pod.Spec.NodeName, string(pod.UID), id, false, r.env.Timeouts.FreezeWatch)
	if err != nil {
		cancel()
		return no("the dump watch did not start: " + err.Error())
	}
	type dump struct {
		criu time.Duration
		err  error
	}
	ch := make(chan dump, 1)
	go func() {
		_, _, c, err := wait()
		ch <- dump{c, err}
	}()
	return func() (time.Duration, string) {
		t := time.NewTimer(dumpGrace)
		defer t.Stop()
		select {
		case d := <-ch:
			switch {
			case d.err != nil:
				return 0, "the dump watch: " + d.err.Error()
			case d.criu <= 0:
				return 0, "the node's agent saw no dump"
			}
			return d.criu, ""
		case <-t.C:
			return 0, fmt.Sprintf("the dump watch did not answer within %s of the call's end", dumpGrace)
		}
	}, cancel
}

// criuStamp is the time stamp CRIU puts before each log line: seconds and
// microseconds since it started, "(00.012345)".
var criuStamp = regexp.MustCompile(`^\((\d{1,6})\.(\d{6})\)`)

// CRIULogSpan is the last time stamp of a CRIU log (or of its tail):
// how long CRIU had run when it wrote its last line. False when no line
// carries a stamp.
func CRIULogSpan(log string) (time.Duration, bool) {
	var last time.Duration
	found := false
	for line := range strings.Lines(log) {
		m := criuStamp.FindStringSubmatch(strings.TrimLeft(line, " \t"))
		if m == nil {
			continue
		}
		s, err1 := strconv.Atoi(m[1])
		us, err2 := strconv.Atoi(m[2])
		if err1 != nil || err2 != nil {
			continue
		}
		if d := time.Duration(s)*time.Second + time.Duration(us)*time.Microsecond; d >= last {
			last, found = d, true
		}
	}
	return last, found
}

// kubeletPulled is the kubelet's Pulled Event message for a pull it did:
// `Successfully pulled image "REF" in 1.234s (1.3s including waiting)...`.
var kubeletPulled = regexp.MustCompile(`^Successfully pulled image "([^"]+)" in ([0-9][0-9.]*(?:ns|us|µs|ms|s|m|h)(?:[0-9][0-9.]*(?:ns|us|µs|ms|s|m|h))*)[ .(]`)

// PulledIn reads how long the kubelet's pull of image took from the
// message of its Pulled Event: the pull itself, without waiting for
// other pulls. present: the kubelet did not pull, the image was on the
// node already (0). False when the message is about another image or in
// neither form.
func PulledIn(msg, image string) (took time.Duration, present, ok bool) {
	if strings.HasPrefix(msg, `Container image "`+image+`" already present on machine`) {
		return 0, true, true
	}
	m := kubeletPulled.FindStringSubmatch(msg)
	if m == nil || m[1] != image {
		return 0, false, false
	}
	d, err := time.ParseDuration(m[2])
	if err != nil || d < 0 {
		return 0, false, false
	}
	return d, false, true
}

// RestoreLogReader is an optional NodeAgent method: it returns (the end
// of) CRIU's log of the restore of the container containerID on node, for
// the report's parts.
type RestoreLogReader interface {
	RestoreLog(ctx context.Context, node, containerID string) (string, error)
}

// measureParts puts the parts of a copy migration that ended well into
// the report: those its phases hold, then the restore's from the target's
// node. It runs after Report.Total is taken: its reads are not the
// migration's time.
func (r *run) measureParts(ctx context.Context) {
	p := partsOf(r.rep, r.criuDump, r.noDump)
	p.PulledAhead, p.PullAheadFailed = r.ahead, r.noAhead
	r.measureRestore(ctx, &p, r.target)
	r.rep.Parts = &p
}

// measureRestore fills the restore's parts from what the target pod's
// node reports: the kubelet's Pulled Event of the checkpoint image, and
// CRIU's restore log through the node's agent. Events and logs are
// tenant-reachable records: a figure is only taken in its exact form, and
// never longer than the restore phase.
func (r *run) measureRestore(ctx context.Context, p *Parts, target *corev1.Pod) {
	if target == nil {
		p.miss(PartPull, "the target pod was not seen running")
		p.miss(PartCRIURestore, "the target pod was not seen running")
		return
	}
	switch d, why := r.pulled(ctx, target); {
	case why != "":
		p.miss(PartPull, why)
	case p.Restore > 0 && d > p.Restore:
		p.miss(PartPull, fmt.Sprintf("the kubelet's Pulled Event says %s, longer than the whole restore phase", d))
	default:
		p.Pull = d
	}
	lr, ok := r.env.Agent.(RestoreLogReader)
	id := containerID(target, r.p.Container)
	switch {
	case !ok:
		p.miss(PartCRIURestore, "the node agent cannot serve the restore log")
		return
	case id == "":
		p.miss(PartCRIURestore, "the target's app container has no ID in its status")
		return
	}
	log, err := lr.RestoreLog(ctx, target.Spec.NodeName, id)
	if err != nil {
		p.miss(PartCRIURestore, "the restore log: "+err.Error())
		return
	}
	d, ok := CRIULogSpan(log)
	switch {
	case !ok:
		p.miss(PartCRIURestore, "the restore log has no time stamps")
	case p.Restore > 0 && d > p.Restore:
		p.miss(PartCRIURestore, fmt.Sprintf("the restore log says %s, longer than the whole restore phase", d))
	default:
		p.CRIURestore = d
	}
}

// pulled is the kubelet's pull of the target's app image, from its
// Pulled Event; or why not.
func (r *run) pulled(ctx context.Context, target *corev1.Pod) (time.Duration, string) {
	image := ""
	for _, c := range target.Spec.Containers {
		if c.Name == r.p.Container {
			image = c.Image
		}
	}
	sel := fields.Set{"involvedObject.name": target.Name, "involvedObject.uid": string(target.UID), "reason": "Pulled"}.AsSelector().String()
	evs, err := r.env.Client.CoreV1().Events(target.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return 0, "the target pod's Events: " + err.Error()
	}
	for _, ev := range evs.Items {
		if ev.InvolvedObject.FieldPath != "spec.containers{"+r.p.Container+"}" {
			continue
		}
		d, present, ok := PulledIn(ev.Message, image)
		switch {
		case !ok:
			continue
		case present:
			return 0, ""
		}
		return d, ""
	}
	return 0, "no Pulled Event of the kubelet for the checkpoint image on the target pod"
}
