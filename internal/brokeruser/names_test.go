package brokeruser

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestPermissionsFor(t *testing.T) {
	p := PermissionsFor("shop")
	if p.Configure != `^shop\.` || p.Write != p.Configure || p.Read != p.Configure {
		t.Fatalf("PermissionsFor(shop) = %+v", p)
	}
	re := regexp.MustCompile(p.Read)
	for name, want := range map[string]bool{
		"shop.orders": true, "shop.a.b": true,
		"shop-eu.orders": false, "shopx.orders": false, "shop": false, "eu.shop.orders": false, "xshop.orders": false,
	} {
		if got := re.MatchString(name); got != want {
			t.Errorf("%s matches %q: %v, want %v", p.Read, name, got, want)
		}
	}
}

func TestParseStreamAddress(t *testing.T) {
	for in, vhost := range map[string]string{
		"rabbitmq-stream://broker:5552/":         "/",
		"rabbitmq-stream://broker:5552":          "/",
		"rabbitmq-stream://broker:5552/%2f":      "/",
		"rabbitmq-stream+tls://broker:5551/team": "team",
	} {
		a, err := ParseStreamAddress(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if a.VHost() != vhost {
			t.Errorf("%s: vhost %q, want %q", in, a.VHost(), vhost)
		}
		if uri := a.URI("ms2m-ns.shop", "pw"); !strings.Contains(uri, "://ms2m-ns.shop:pw@broker:") {
			t.Errorf("%s: URI %s", in, uri)
		}
	}
	for _, in := range []string{
		"rabbitmq-stream://guest:guest@broker:5552/", // credentials: refused
		"amqp://broker:5672/", "rabbitmq-stream:///", "rabbitmq-stream://broker:5552/a/b", "rabbitmq-stream://broker/?x=1",
	} {
		if _, err := ParseStreamAddress(in); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
}

func TestNewPassword(t *testing.T) {
	a, err := NewPassword(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewPassword(nil)
	if a == b || !wellFormed(a) || !wellFormed(b) {
		t.Errorf("passwords %q %q", a, b)
	}
	if _, err := NewPassword(bytes.NewReader(make([]byte, 3))); err == nil {
		t.Error("a short random source gave a password")
	}
	for _, bad := range []string{"", "short", strings.Repeat("a", 44), strings.Repeat("a", 42) + "/"} {
		if wellFormed(bad) {
			t.Errorf("wellFormed(%q)", bad)
		}
	}
}

func TestCheckUserPrefix(t *testing.T) {
	for p, ok := range map[string]bool{
		"ms2m-ns.": true, "ms2m-ns.prod-eu.": true, "a.": true,
		"": false, "ms2m-ns": false, "ms2m:ns.": false, "ms2m..": false, ".": false, "a/b.": false, strings.Repeat("a", 64) + ".": false,
	} {
		if err := CheckUserPrefix(p); (err == nil) != ok {
			t.Errorf("CheckUserPrefix(%q) = %v", p, err)
		}
	}
}
