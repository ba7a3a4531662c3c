package migrate

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// TestNamesStayBounded: every name a migration derives stays within its
// limit and valid however often it is derived from the last one: each
// helper is applied 50 times in a row, to short and to the longest names.
func TestNamesStayBounded(t *testing.T) {
	long := strings.Repeat("a", 200) + ".b-" + strings.Repeat("c", 49) // a 253-character pod name
	rs := "consumer-" + strings.Repeat("d", 50) + "-5ff94789cb"
	now := time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC)
	dns1123Label := func(s string) []string { return validation.IsDNS1123Label(s) }
	labelValue := func(s string) []string { return validation.IsValidLabelValue(s) }
	dnsSubdomain := func(s string) []string { return validation.IsDNS1123Subdomain(s) }
	tagRE := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	tag := func(s string) []string {
		if !tagRE.MatchString(s) {
			return []string{"not a tag"}
		}
		return nil
	}
	for name, tc := range map[string]struct {
		start string
		next  func(prev string, i int) string
		max   int
		valid func(string) []string
	}{
		"bare pod":                 {start: "example", next: func(p string, i int) string { return BarePodName(p, fmt.Sprintf("x%04d", i)) }, max: MaxPodNameLen, valid: dns1123Label},
		"bare pod, long name":      {start: long, next: func(p string, i int) string { return BarePodName(p, fmt.Sprintf("x%04d", i)) }, max: MaxPodNameLen, valid: dns1123Label},
		"ReplicaSet's pod":         {start: "example-5ff94789cb-8t97s", next: func(string, int) string { return ReplicaSetPodName("example-5ff94789cb", "8t97s") }, max: MaxPodNameLen, valid: dns1123Label},
		"ReplicaSet's pod, long":   {start: rs + "-8t97s", next: func(string, int) string { return ReplicaSetPodName(rs, "8t97s") }, max: MaxPodNameLen, valid: dns1123Label},
		"migration name":           {start: "example", next: func(p string, i int) string { return MigrationName(p, now.Add(time.Duration(i)*time.Minute)) }, max: MaxMigrationNameLen, valid: dns1123Label},
		"migration name, long pod": {start: long, next: func(p string, i int) string { return MigrationName(p, now) }, max: MaxMigrationNameLen, valid: dns1123Label},
		"shadow pod":               {start: long, next: func(p string, i int) string { return ShadowName(MigrationName(p, now)) }, max: MaxPodNameLen, valid: dns1123Label},
		"shadow pod of any name":   {start: long, next: func(p string, i int) string { return ShadowName(p) }, max: MaxPodNameLen, valid: dns1123Label},
		"image tag":                {start: long, next: func(p string, i int) string { return ImageTag(MigrationName(BarePodName(p, "x0000"), now)) }, max: MaxTagLen, valid: tag},
		"shadow's image tag":       {start: long, next: func(p string, i int) string { return ImageTag(ShadowName(p)) }, max: MaxTagLen, valid: tag},
		"migration label":          {start: long, next: func(p string, i int) string { return MigrationLabel(MigrationName(p, now)) }, max: MaxLabelLen, valid: labelValue},
		"shadow-of label":          {start: long, next: func(p string, i int) string { return ShadowOfLabel(p) }, max: MaxLabelLen, valid: labelValue},
		"criu-alone log": {start: "ns." + long, next: func(p string, i int) string {
			return inject.OwnLogName(p, MigrationName(long, now.Add(time.Duration(i)*time.Second)))
		}, max: MaxLogNameLen},
		"pending ConfigMap of a StatefulSet's pod": {start: strings.Repeat("s", MaxPodNameLen), next: func(p string, i int) string {
			return contract.PendingConfigMapName(strings.TrimPrefix(p, contract.PendingConfigMapPrefix))
		}, max: MaxObjectNameLen, valid: dnsSubdomain},
	} {
		t.Run(name, func(t *testing.T) {
			got := tc.start
			for i := range 50 {
				got = tc.next(got, i)
				if len(got) > tc.max {
					t.Fatalf("after %d: %q is %d characters, over %d", i+1, got, len(got), tc.max)
				}
				if tc.valid != nil {
					if errs := tc.valid(got); len(errs) > 0 {
						t.Fatalf("after %d: %q: %v", i+1, got, errs)
					}
				}
			}
		})
	}
}

// TestMigrationName: <pod>-<time in base 36>-<random>, the pod's name cut
// to fit; two names for one pod at one instant differ.
func TestMigrationName(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC) // tpnhg0 in base 36
	long := strings.Repeat("a", 60) + "-5ff94789cb-8t97s"
	for name, tc := range map[string]struct {
		pod, random, want string
	}{
		"short pod": {pod: "consumer-5ff94789cb-8t97s", random: "b7x2k", want: "consumer-5ff94789cb-8t97s-tpnhg0-b7x2k"},
		"long pod":  {pod: long, random: "b7x2k", want: bounded(long, MaxMigrationNameLen-len("-tpnhg0-b7x2k")) + "-tpnhg0-b7x2k"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := migrationName(tc.pod, now, tc.random); got != tc.want || len(got) > MaxMigrationNameLen {
				t.Errorf("= %q (%d characters), want %q, at most %d", got, len(got), tc.want, MaxMigrationNameLen)
			}
		})
	}
	form := regexp.MustCompile(`^consumer-tpnhg0-[a-z0-9]{5}$`)
	a, b := MigrationName("consumer", now), MigrationName("consumer", now)
	if !form.MatchString(a) || !form.MatchString(b) || a == b {
		t.Errorf("MigrationName twice at one instant: %q and %q, want two names of the form %s", a, b, form)
	}
}

func TestNextPodName(t *testing.T) {
	yes := true
	owned := func(kind, name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: kind, Name: name, Controller: &yes}}
	}
	for name, tc := range map[string]struct {
		pod  metav1.ObjectMeta
		want string // a regexp
	}{
		"ReplicaSet's pod":                  {pod: metav1.ObjectMeta{Name: "example-5ff94789cb-8t97s", OwnerReferences: owned("ReplicaSet", "example-5ff94789cb")}, want: `^example-5ff94789cb-[a-z0-9]{5}$`},
		"ReplicaSet's pod, old long name":   {pod: metav1.ObjectMeta{Name: "example-5ff94789cb-8t97s-tpj32c-tpj40x", OwnerReferences: owned("ReplicaSet", "example-5ff94789cb")}, want: `^example-5ff94789cb-[a-z0-9]{5}$`},
		"StatefulSet's pod keeps its name":  {pod: metav1.ObjectMeta{Name: "db-0", OwnerReferences: owned("StatefulSet", "db")}, want: `^db-0$`},
		"bare pod":                          {pod: metav1.ObjectMeta{Name: "example"}, want: `^example-ms2m-[a-z0-9]{5}$`},
		"bare pod migrated before":          {pod: metav1.ObjectMeta{Name: "example-ms2m-b7x2k"}, want: `^example-ms2m-[a-z0-9]{5}$`},
		"bare pod held by a pod (a target)": {pod: metav1.ObjectMeta{Name: "example-ms2m-b7x2k", OwnerReferences: owned("Pod", "example")}, want: `^example-ms2m-[a-z0-9]{5}$`},
	} {
		t.Run(name, func(t *testing.T) {
			got := NextPodName(&corev1.Pod{ObjectMeta: tc.pod})
			if !regexp.MustCompile(tc.want).MatchString(got) {
				t.Errorf("NextPodName = %q, want %s", got, tc.want)
			}
		})
	}
}
