package inject

import (
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestLogNames(t *testing.T) {
	if got, want := DefaultLogName("shop", "orders-0"), "shop.orders-0"; got != want {
		t.Errorf("DefaultLogName = %q, want %q", got, want)
	}
	if got, want := defaultLogNameValue, "$(POD_NAMESPACE).$(POD_NAME)"; got != want {
		t.Errorf("the injected default = %q, want %q", got, want)
	}
	long := DefaultLogName("shop", strings.Repeat("é", 120)) // 245 bytes
	tests := map[string]struct {
		log, migration string
		want           string // "" = check only the bounds
	}{
		"short":       {log: "shop.orders-0", migration: "m1", want: "shop.orders-0.criu-alone.m1"},
		"again":       {log: "shop.orders-0.criu-alone.m1", migration: "m2", want: "shop.orders-0.criu-alone.m2"},
		"exactly 255": {log: "shop." + strings.Repeat("o", 236), migration: "m1", want: "shop." + strings.Repeat("o", 236) + ".criu-alone.m1"},
		"over 255":    {log: long, migration: "orders-0-migration-to-node-b"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := OwnLogName(tc.log, tc.migration)
			if tc.want != "" && got != tc.want {
				t.Errorf("OwnLogName = %q, want %q", got, tc.want)
			}
			if len(got) > maxLogNameLen || !utf8.ValidString(got) || !strings.HasPrefix(got, "shop.") || checkLogNameIn("shop", got) != "" {
				t.Errorf("OwnLogName = %q (%d bytes): want a valid stream name of at most %d bytes in namespace shop", got, len(got), maxLogNameLen)
			}
			if other := OwnLogName(tc.log, tc.migration+"x"); other == got {
				t.Errorf("OwnLogName gives %q for two migrations", got)
			}
		})
	}
}

func TestCheckLogNameIn(t *testing.T) {
	for v, wantOK := range map[string]bool{
		"shop.orders-0":                    true,
		"shop.a.b":                         true,
		"shop.":                            false, // nothing after the prefix
		"shop":                             false,
		"shop-eu.orders-0":                 false,
		"billing.orders":                   false,
		".orders":                          false,
		"orders":                           false,
		"shop.a b":                         false,
		"shop." + strings.Repeat("x", 250): true,
		"shop." + strings.Repeat("x", 251): false,
	} {
		if got := checkLogNameIn("shop", v) == ""; got != wantOK {
			t.Errorf("checkLogNameIn(shop, %q) ok = %v, want %v (%s)", v, got, wantOK, checkLogNameIn("shop", v))
		}
	}
}

func TestCheckDefaultLogName(t *testing.T) {
	pod := func(name, generate string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: strings.Repeat("n", 63), Name: name, GenerateName: generate}}
	}
	for name, tc := range map[string]struct {
		pod    *corev1.Pod
		wantOK bool
	}{
		"short name":                 {pod: pod("orders-0", ""), wantOK: true},
		"191-byte name":              {pod: pod(strings.Repeat("p", 191), ""), wantOK: true},
		"192-byte name":              {pod: pod(strings.Repeat("p", 192), ""), wantOK: false},
		"generateName of any length": {pod: pod("", strings.Repeat("g", 200)), wantOK: true},
	} {
		if got := checkDefaultLogName(tc.pod) == ""; got != tc.wantOK {
			t.Errorf("%s: checkDefaultLogName ok = %v, want %v (%s)", name, got, tc.wantOK, checkDefaultLogName(tc.pod))
		}
	}
}

func TestExpandEnvRefs(t *testing.T) {
	vars := map[string]string{"NS": "shop", "POD": "orders-0"}
	lookup := func(ref string) (string, bool, bool) {
		if ref == "SECRET" {
			return "", false, true
		}
		v, ok := vars[ref]
		return v, true, ok
	}
	for in, want := range map[string]struct {
		out   string
		known bool
	}{
		"$(NS).$(POD)":      {"shop.orders-0", true},
		"$$(NS).x":          {"$(NS).x", true},
		"$(UNDEFINED).x":    {"$(UNDEFINED).x", true},
		"$(NS).$(SECRET)":   {"shop.", false},
		"a$b$":              {"a$b$", true},
		"$(NS":              {"$(NS", true},
		"plain.name":        {"plain.name", true},
		"$(NS)$(NS)$$$(NS)": {"shopshop$shop", true},
	} {
		out, known := expandEnvRefs(in, lookup)
		if out != want.out || known != want.known {
			t.Errorf("expandEnvRefs(%q) = %q, %v; want %q, %v", in, out, known, want.out, want.known)
		}
	}
}
