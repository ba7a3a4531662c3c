package inject

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ms2m/ms2m/internal/contract"
)

// annotationCheck checks one annotation's value. It returns "" when the
// value is fine, or what is allowed instead.
type annotationCheck struct {
	key   string
	check func(pod *corev1.Pod, v string) string
}

// annotationChecks are the value checks, in the order their messages are
// joined. contract.AnnotationInject is checked before the rest (it decides whether
// the rest matter) and contract.AnnotationStatus is ms2m's own.
var annotationChecks = []annotationCheck{
	{contract.AnnotationContainer, checkContainer},
	{contract.AnnotationBrokerEnv, checkBrokerEnv},
	{contract.AnnotationLogName, checkLogNameAnnotation},
	{contract.AnnotationLogMaxAge, checkPositiveDuration},
	{contract.AnnotationUpstreamTLSSecret, func(_ *corev1.Pod, v string) string {
		if len(validation.IsDNS1123Subdomain(v)) > 0 {
			return "use the name of a Secret in the pod's namespace"
		}
		return ""
	}},
	{contract.AnnotationUpstreamTLSServerName, func(_ *corev1.Pod, v string) string {
		if len(validation.IsDNS1123Subdomain(strings.ToLower(v))) > 0 {
			return "use the DNS name in the broker's certificate"
		}
		return ""
	}},
	{contract.AnnotationUpstreamAuth, func(pod *corev1.Pod, v string) string {
		switch {
		case v != "PLAIN" && v != "EXTERNAL":
			return "use PLAIN or EXTERNAL"
		case v == "EXTERNAL" && pod.Annotations[contract.AnnotationUpstreamTLSSecret] == "":
			return "EXTERNAL needs the client certificate: set " + contract.AnnotationUpstreamTLSSecret + " to a Secret with tls.crt and tls.key"
		}
		return ""
	}},
	{contract.AnnotationLogMaxBytes, func(_ *corev1.Pod, v string) string {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			return "use a byte count, an integer of 0 or more (0: no limit)"
		}
		return ""
	}},
	{contract.AnnotationMigrateTo, func(_ *corev1.Pod, v string) string { return checkNodeName(v) }},
	{contract.AnnotationStrategy, func(_ *corev1.Pod, v string) string {
		if !contract.Strategy(v).Valid() {
			return "use one of " + strings.Join(contract.StrategyNames(), ", ")
		}
		return ""
	}},
	{contract.AnnotationMigrateForce, func(_ *corev1.Pod, v string) string {
		if v != "true" && v != "false" {
			return "use \"true\" to migrate past the pod's node selector, affinity and the node's taints, or \"false\""
		}
		return ""
	}},
	{contract.AnnotationOnEvict, func(_ *corev1.Pod, v string) string {
		if v != contract.OnEvictMigrate && v != contract.OnEvictEvict {
			return "use \"" + contract.OnEvictMigrate + "\" to migrate the pod when it is evicted, or \"" + contract.OnEvictEvict + "\""
		}
		return ""
	}},
	{contract.AnnotationOnEvictOverride, func(_ *corev1.Pod, v string) string {
		if v != "true" && v != "false" {
			return "use \"true\" to let a plain eviction through, or \"false\""
		}
		return ""
	}},
	{contract.AnnotationEvacuate, func(_ *corev1.Pod, v string) string { return checkNodeName(v) }},
	{contract.AnnotationReplayMax, checkPositiveDuration},
	{contract.AnnotationCutoff, func(_ *corev1.Pod, v string) string {
		if !contract.CutoffRule(v).Valid() {
			return "use one of " + strings.Join(contract.CutoffRuleNames(), ", ")
		}
		return ""
	}},
	{contract.AnnotationRestoreImage, func(_ *corev1.Pod, v string) string {
		if v == "" || strings.IndexFunc(v, unicode.IsSpace) >= 0 {
			return "use an image reference (the checkpoint image), without spaces"
		}
		return ""
	}},
	{contract.AnnotationRestoreNode, func(_ *corev1.Pod, v string) string { return checkNodeName(v) }},
	{contract.AnnotationReplayStart, func(_ *corev1.Pod, v string) string { return checkReplayStart(v) }},
	{contract.AnnotationReplayCutoff, func(_ *corev1.Pod, v string) string { return checkReplayCutoff(v) }},
	{contract.AnnotationReplayEpoch, func(_ *corev1.Pod, v string) string { return checkReplayEpoch(v) }},
	{contract.AnnotationReplaySkip, func(_ *corev1.Pod, v string) string { return checkReplaySkip(v) }},
	{contract.AnnotationMigrationName, func(_ *corev1.Pod, v string) string { return checkMigrationName(v) }},
}

// checkInjectAnnotation checks contract.AnnotationInject alone, before anything
// else: an opt-in with a bad value must not pass as "not opted in".
// The pod label contract.LabelInject is held to the same two values.
func checkInjectAnnotation(pod *corev1.Pod) error {
	if v, ok := pod.Annotations[contract.AnnotationInject]; ok && v != "true" && v != "false" {
		return denyf("annotation %s is %s: use \"true\" to inject the ms2m sidecar or \"false\" to opt out", contract.AnnotationInject, quote(v))
	}
	if v, ok := pod.Labels[contract.LabelInject]; ok && v != "true" && v != "false" {
		return denyf("label %s is %s: use \"true\" to inject the ms2m sidecar (and have pod creation wait for the webhook) or \"false\" to opt out", contract.LabelInject, quote(v))
	}
	return nil
}

// checkAnnotations checks every ms2m annotation's value. It returns a
// *DenyError naming each bad one, and a warning for each key under contract.Prefix
// that ms2m does not know.
func checkAnnotations(pod *corev1.Pod) (warnings []string, err error) {
	var bad []string
	for _, c := range annotationChecks {
		v, ok := pod.Annotations[c.key]
		if !ok {
			continue
		}
		if allowed := c.check(pod, v); allowed != "" {
			bad = append(bad, fmt.Sprintf("annotation %s is %s: %s", c.key, quote(v), allowed))
		}
	}
	if msg := checkReplayRange(pod.Annotations[contract.AnnotationReplayStart], pod.Annotations[contract.AnnotationReplayCutoff]); msg != "" {
		bad = append(bad, fmt.Sprintf("annotations %s and %s: %s", contract.AnnotationReplayStart, contract.AnnotationReplayCutoff, msg))
	}
	var unknown []string
	for k := range pod.Annotations {
		if strings.HasPrefix(k, contract.Prefix) && !contract.KnownAnnotations[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		w := "unknown annotation " + k + ": ignored"
		if s := closestKnown(k); s != "" {
			w += " (did you mean " + s + "?)"
		}
		warnings = append(warnings, w)
	}
	if len(bad) > 0 {
		return warnings, &DenyError{Msg: strings.Join(bad, "; ")}
	}
	return warnings, nil
}

func checkContainer(pod *corev1.Pod, v string) string {
	var names []string
	for _, c := range pod.Spec.Containers {
		if c.Name == v {
			return ""
		}
		names = append(names, c.Name)
	}
	return "the pod has no such container; use one of " + strings.Join(names, ", ")
}

func checkBrokerEnv(_ *corev1.Pod, v string) string {
	names := splitList(v)
	if len(names) == 0 {
		return "use env var names, separated by commas"
	}
	for _, n := range names {
		if len(validation.IsEnvVarName(n)) > 0 {
			return fmt.Sprintf("use env var names, separated by commas (%q is not one)", n)
		}
	}
	return ""
}

func checkPositiveDuration(_ *corev1.Pod, v string) string {
	if d, err := time.ParseDuration(v); err != nil || d <= 0 {
		return "use a Go duration above 0, such as 30s or 24h"
	}
	return ""
}

func checkNodeName(v string) string {
	if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
		return "use a node name, a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
	}
	return ""
}

// checkLogName checks a replay log (stream) name.
func checkLogName(v string) string {
	const allowed = "use a stream name of 1 to 255 characters without spaces or slashes"
	if v == "" || len(v) > maxLogNameLen || !utf8.ValidString(v) {
		return allowed
	}
	if strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == '/' }) >= 0 {
		return allowed
	}
	return ""
}

func checkReplayStart(v string) string {
	if _, err := strconv.ParseUint(v, 10, 64); err != nil {
		return "use a checkpoint ID, an integer of 0 or more"
	}
	return ""
}

func checkReplayEpoch(v string) string {
	if _, err := strconv.ParseUint(v, 10, 64); err != nil {
		return "use the replay log's epoch at the checkpoint, an integer of 0 or more"
	}
	return ""
}

// checkReplaySkip checks a list of delivery IDs not to replay: whole
// numbers above 0, ascending, comma-separated, at most maxReplaySkip. That
// they lie in the range is the sidecar's to check (replay.Range.Validate).
func checkReplaySkip(v string) string {
	const msg = "use delivery IDs, whole numbers above 0, ascending and comma-separated, at most 10000"
	parts := strings.Split(v, ",")
	if len(parts) > maxReplaySkip {
		return msg
	}
	var last uint64
	for _, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil || n <= last || p != strconv.FormatUint(n, 10) {
			return msg
		}
		last = n
	}
	return ""
}

// maxReplaySkip is replay.MaxSkip (inject imports no replay).
const maxReplaySkip = 10000

func checkReplayCutoff(v string) string {
	if v == "marker" || v == "end" {
		return ""
	}
	if n, err := strconv.ParseUint(v, 10, 64); err != nil || n == 0 {
		return "use \"marker\", \"end\" or the last ID to replay, an integer above 0"
	}
	return ""
}

// checkReplayRange checks that a numeric cutoff is not below the start
// (the sidecar refuses that at start). Either may be absent or bad: those
// are reported on their own.
func checkReplayRange(start, cutoff string) string {
	s, err1 := strconv.ParseUint(start, 10, 64)
	c, err2 := strconv.ParseUint(cutoff, 10, 64)
	if err1 != nil || err2 != nil || c >= s {
		return ""
	}
	return fmt.Sprintf("the cutoff %d is below the start %d; replay covers (start, cutoff], so use a cutoff at or above the start", c, s)
}

func checkMigrationName(v string) string {
	if v == "" || len(v) > validation.DNS1123SubdomainMaxLength || strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return "use the migration's name, 1 to 253 characters without spaces"
	}
	return ""
}

// splitList splits a comma-separated list, trimming spaces and dropping
// empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// quote quotes a value for a message, cut to a readable length.
func quote(v string) string {
	const max = 80
	if len(v) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		return strconv.Quote(v[:cut]) + "…"
	}
	return strconv.Quote(v)
}

// closestKnown is the known key within two edits of k, if there is one.
func closestKnown(k string) string {
	best, bestD := "", 3
	for known := range contract.KnownAnnotations {
		if d := editDistance(k, known); d < bestD || (d == bestD && known < best) {
			best, bestD = known, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func denyf(format string, args ...any) *DenyError {
	return &DenyError{Msg: fmt.Sprintf(format, args...)}
}
