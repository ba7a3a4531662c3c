package migrate

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/ms2m/ms2m/internal/sign"
)

// Names. A pod is migrated over and over, so nothing a migration names may
// grow with the number of migrations: each name is made from the pod's
// current name, and each helper bounds what it makes, whatever it is given.
// TestNamesStayBounded applies each one 50 times in a row.

const (
	// MaxPodNameLen bounds the pods a migration makes: a pod's name is its
	// hostname, which is cut at 63.
	MaxPodNameLen = 63
	// MaxLabelLen bounds a label value.
	MaxLabelLen = 63
	// MaxTagLen bounds an image tag.
	MaxTagLen = 128
	// MaxObjectNameLen bounds the name of a ConfigMap (a DNS subdomain).
	MaxObjectNameLen = 253
	// MaxLogNameLen bounds a replay log's name (an AMQP short string).
	MaxLogNameLen = 255

	shadowSuffix = "-shadow"
	// MaxMigrationNameLen bounds a migration's name, which is the
	// checkpoint image's tag, a label value on the pending-migration
	// ConfigMap, and with shadowSuffix the shadow pod's name.
	MaxMigrationNameLen = MaxPodNameLen - len(shadowSuffix)

	// randomLen is the random suffix of a ReplicaSet's pod names.
	randomLen = 5
	// bareSuffix starts the suffix a migrated bare pod's name ends with;
	// the next migration replaces it.
	bareSuffix = "-ms2m-"
)

// bounded returns s cut to at most n bytes; a cut name keeps a short hash
// of the whole, so that names that differ only past the cut stay apart,
// and never ends in '-' or '.', so that it stays a DNS label, a label value
// and a tag.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	sum := fmt.Sprintf("%08x", h.Sum32())[:6]
	head := strings.TrimRight(s[:n-len(sum)-1], "-.")
	return head + "-" + sum
}

// MigrationName names a migration of pod started at now:
// <pod>-<time>-<random>, the pod's name (cut to fit), the time in seconds
// in base 36, and randomLen random characters, at most
// MaxMigrationNameLen. The random part keeps apart the migrations of one
// pod that start within one second (a request refused at once and asked
// again, a rebuild and a request): named by the time alone, the second
// took the first's name, and with it the first's place in the pod's
// history, its Events, its checkpoint image's tag and its pending record.
// A migration keeps the name it was given: it is recorded in its status
// (and pending record), and whatever resumes the migration reads it there.
func MigrationName(pod string, now time.Time) string {
	return migrationName(pod, now, utilrand.String(randomLen))
}

// migrationName is MigrationName with random as the random part.
func migrationName(pod string, now time.Time, random string) string {
	ts := strconv.FormatInt(now.Unix(), 36)
	return bounded(pod, MaxMigrationNameLen-len(ts)-len(random)-2) + "-" + ts + "-" + random
}

// ShadowName is the shadow pod of migration: not <set>-<ordinal>, so that
// the StatefulSet never claims it; at most MaxPodNameLen.
func ShadowName(migration string) string {
	return bounded(migration, MaxMigrationNameLen) + shadowSuffix
}

// ImageTag is the tag of the checkpoint image of migration (its shadow's:
// ShadowName), at most MaxTagLen.
func ImageTag(migration string) string { return bounded(migration, MaxTagLen) }

// ContainerTag is the tag of the checkpoint image of container, an app
// container of a whole pod after the first, in the checkpoint tagged tag
// (a migration's name, or its shadow's). The '_' keeps it apart from any
// migration's or shadow's name, which never holds one.
func ContainerTag(tag, container string) string { return tag + "_" + container }

// tagSecretLen is the length of the unguessable part of a checkpoint
// image's tag: 22 base64url characters, 132 bits.
const tagSecretLen = 22

// imageTagContext separates CheckpointRef's MACs from every other use of
// the controller's key.
const imageTagContext = "ms2m.io/checkpoint-tag/v1"

// CheckpointRef is where the checkpoint image tagged tag (a migration's
// name, or its shadow's) of a pod in namespace goes: the namespace's own
// repository below repo, so that pulls and deletes can be granted per
// namespace, under a tag no tenant can guess: ImageTag(tag), cut to fit,
// and a MAC of namespace and tag with key. Only the holder of the key (the
// controller) can name the image again, to delete it; a tenant who knows
// another's migration name cannot pull its memory by name.
func CheckpointRef(repo, namespace, tag string, key []byte) string {
	secret := sign.MAC(key, imageTagContext, namespace, tag)[:tagSecretLen]
	return strings.TrimSuffix(repo, "/") + "/" + namespace + ":" + bounded(ImageTag(tag), MaxTagLen-1-tagSecretLen) + "-" + secret
}

// MigrationLabel is the value of the ms2m.io/migration label for
// migration, at most MaxLabelLen.
func MigrationLabel(migration string) string { return bounded(migration, MaxLabelLen) }

// ShadowOfLabel is the value of the ms2m.io/shadow-of label for the pod
// named pod, at most MaxLabelLen.
func ShadowOfLabel(pod string) string { return bounded(pod, MaxLabelLen) }

// ReplicaSetPodName is a name of the form the ReplicaSet rs gives its pods
// (rs-<5 random characters>, the base cut as the API server cuts a
// generateName), with random as the suffix.
func ReplicaSetPodName(rs, random string) string {
	base := rs + "-"
	if max := MaxPodNameLen - randomLen; len(base) > max {
		base = base[:max]
	}
	return base + random
}

var bareSuffixRE = regexp.MustCompile(regexp.QuoteMeta(bareSuffix) + "[a-z0-9]{" + strconv.Itoa(randomLen) + "}$")

// BarePodName is the name of a bare pod's target: pod's name with the
// suffix of its last migration replaced by one with random (not added to),
// cut to MaxPodNameLen.
func BarePodName(pod, random string) string {
	base := bareSuffixRE.ReplaceAllString(pod, "")
	return bounded(base, MaxPodNameLen-len(bareSuffix)-len(random)) + bareSuffix + random
}

// NextPodName names the target of a migration of pod by the copy
// strategies: of a ReplicaSet's pod, a fresh name of the ReplicaSet's
// form; of a StatefulSet's, its own (the StatefulSet recreates it); of a
// bare pod, BarePodName.
func NextPodName(pod *corev1.Pod) string {
	switch c := controllerOf(pod); {
	case c != nil && c.Kind == "ReplicaSet":
		return ReplicaSetPodName(c.Name, utilrand.String(randomLen))
	case c != nil && c.Kind == "StatefulSet":
		return pod.Name
	}
	return BarePodName(pod.Name, utilrand.String(randomLen))
}
