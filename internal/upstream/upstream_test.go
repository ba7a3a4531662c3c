package upstream_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/ms2m/ms2m/internal/upstream"
)

// amqpThrough opens an AMQP connection whose socket d makes, with the
// credentials in url and auth (nil: PLAIN from the URL).
func amqpThrough(t *testing.T, d *upstream.Dialer, url string, auth []amqp.Authentication) (*amqp.Connection, error) {
	t.Helper()
	return amqp.DialConfig(url, amqp.Config{
		SASL: auth,
		Dial: func(string, string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			nc, _, err := d.Dial(ctx)
			return nc, err
		},
	})
}

// external is SASL EXTERNAL: the client certificate is the identity.
type external struct{}

func (external) Mechanism() string { return "EXTERNAL" }
func (external) Response() string  { return "" }

func TestUpstreamTLS(t *testing.T) {
	b := testenv.RequireTLSBroker(t)
	tests := map[string]struct {
		tls     upstream.TLS
		auth    []amqp.Authentication
		wantErr string // "" when the connection must open
	}{
		"verified against the test CA": {tls: upstream.TLS{CAFile: b.CAFile}},
		"server name given":            {tls: upstream.TLS{CAFile: b.CAFile, ServerName: "localhost"}},
		"wrong server name refused":    {tls: upstream.TLS{CAFile: b.CAFile, ServerName: "wrong-name.invalid"}, wantErr: "certificate is valid for"},
		"unknown CA refused":           {tls: upstream.TLS{}, wantErr: "unknown authority"},
		"EXTERNAL with a client certificate": {
			tls:  upstream.TLS{CAFile: b.CAFile, CertFile: b.ClientCert, KeyFile: b.ClientKey},
			auth: []amqp.Authentication{external{}},
		},
		"EXTERNAL without a client certificate refused": {
			tls: upstream.TLS{CAFile: b.CAFile}, auth: []amqp.Authentication{external{}}, wantErr: "403",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := upstream.NewDialer(upstream.Config{Addresses: []string{b.AMQPAddr}, TLS: &tc.tls}, nil)
			if err != nil {
				t.Fatal(err)
			}
			c, err := amqpThrough(t, d, "amqp://guest:guest@"+b.AMQPAddr+"/", tc.auth)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("connect over TLS: %v", err)
				}
				defer c.Close()
				ch, err := c.Channel()
				if err != nil {
					t.Fatalf("open a channel over TLS: %v", err)
				}
				if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
					t.Fatalf("declare a queue over TLS: %v", err)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatalf("connected; want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v; want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func TestUpstreamFailover(t *testing.T) {
	b := testenv.RequireBroker(t)
	dead := deadAddr(t)
	var toDead atomic.Int32
	var dialer net.Dialer
	d, err := upstream.NewDialer(upstream.Config{Addresses: []string{dead, b.AMQPAddr}}, func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == dead {
			toDead.Add(1)
		}
		return dialer.DialContext(ctx, network, addr)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c, err := amqpThrough(t, d, b.AMQPURL, nil)
		if err != nil {
			t.Fatalf("connection %d with the first broker down: %v", i, err)
		}
		c.Close()
	}
	if n := toDead.Load(); n != 1 {
		t.Errorf("the dead broker was dialed %d times for 3 connections; want 1 (later ones start at the broker that answered)", n)
	}

	all, err := upstream.NewDialer(upstream.Config{Addresses: []string{dead, deadAddr(t)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = all.Dial(t.Context())
	if err == nil || !strings.Contains(err.Error(), dead) {
		t.Fatalf("all brokers down: error = %v; want one naming %s", err, dead)
	}
}

func TestParseAddresses(t *testing.T) {
	tests := map[string]struct {
		in      string
		tls     bool // the default is TLS
		want    upstream.Addresses
		wantErr string
	}{
		"host:port":          {in: "rabbit:5672", want: upstream.Addresses{Hosts: []string{"rabbit:5672"}}},
		"host only":          {in: "rabbit", want: upstream.Addresses{Hosts: []string{"rabbit:5672"}}},
		"amqps default port": {in: "amqps://rabbit", want: upstream.Addresses{Hosts: []string{"rabbit:5671"}, TLS: true}},
		"URI with credentials and vhost": {
			in: "amqps://app:p%40ss%2Fw@rabbit.prod:5671/orders%2Fv1",
			want: upstream.Addresses{Hosts: []string{"rabbit.prod:5671"}, TLS: true,
				Username: "app", Password: "p@ss/w", HasCredentials: true, VirtualHost: "orders/v1", HasVirtualHost: true},
		},
		"URI with root path keeps the default vhost": {
			in: "amqp://u:p@rabbit/", want: upstream.Addresses{Hosts: []string{"rabbit:5672"}, Username: "u", Password: "p", HasCredentials: true},
		},
		"Spring list with user info": {
			in: "app:secret@r1:5671/prod, r2:5671,r3:5671,r1:5671",
			want: upstream.Addresses{Hosts: []string{"r1:5671", "r2:5671", "r3:5671"},
				Username: "app", Password: "secret", HasCredentials: true, VirtualHost: "prod", HasVirtualHost: true},
		},
		"IPv6":                          {in: "[fd00::1]:5671", want: upstream.Addresses{Hosts: []string{"[fd00::1]:5671"}}},
		"mixed schemes":                 {in: "amqp://a,amqps://b", wantErr: "mix"},
		"other scheme":                  {in: "http://a", wantErr: "scheme"},
		"bad port":                      {in: "a:0", wantErr: "port"},
		"empty":                         {in: " , ", wantErr: "no broker"},
		"bad password escape not shown": {in: "amqp://u:s3cr%zz@a", wantErr: "password"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := upstream.ParseAddresses(tc.in, tc.tls)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v; want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cr") {
					t.Fatalf("error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func plain(user, pass string) []byte { return []byte("\x00" + user + "\x00" + pass) }

func TestHandshake(t *testing.T) {
	props := []byte{}
	tests := map[string]struct {
		cfg       upstream.Config
		startOk   amqpwire.ConnectionStartOk
		vhost     string
		wantOk    *amqpwire.ConnectionStartOk // nil: unchanged
		wantVhost string                      // "": unchanged
	}{
		"placeholders replaced": {
			cfg:       upstream.Config{Username: "app", Password: "secret", VirtualHost: "prod"},
			startOk:   amqpwire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN", Response: plain(upstream.PlaceholderUser, upstream.PlaceholderPassword), Locale: "en_US"},
			vhost:     "/",
			wantOk:    &amqpwire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN", Response: plain("app", "secret"), Locale: "en_US"},
			wantVhost: "prod",
		},
		"the app's own credentials win": {
			cfg:     upstream.Config{Username: "app", Password: "secret", VirtualHost: "prod"},
			startOk: amqpwire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN", Response: plain("mine", "pw"), Locale: "en_US"},
			vhost:   "mine",
		},
		"placeholders without configured credentials pass": {
			startOk: amqpwire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN", Response: plain(upstream.PlaceholderUser, "x"), Locale: "en_US"},
			vhost:   "/",
		},
		"EXTERNAL always": {
			cfg:       upstream.Config{Mechanism: upstream.MechanismEXTERNAL, VirtualHost: "prod"},
			startOk:   amqpwire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN", Response: plain(upstream.PlaceholderUser, "x"), Locale: "en_US"},
			vhost:     "/",
			wantOk:    &amqpwire.ConnectionStartOk{ClientProperties: props, Mechanism: "EXTERNAL", Locale: "en_US"},
			wantVhost: "prod",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.cfg.Addresses = []string{"rabbit:5671"}
			if tc.cfg.Mechanism == upstream.MechanismEXTERNAL {
				tc.cfg.TLS = &upstream.TLS{CertFile: "c", KeyFile: "k"}
			}
			d, err := upstream.NewDialer(tc.cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			h := d.NewHandshake()
			var got *amqpwire.ConnectionStartOk
			if m := h.StartOk(&tc.startOk); m != nil {
				got = m.(*amqpwire.ConnectionStartOk)
			}
			if diff := cmp.Diff(tc.wantOk, got); diff != "" {
				t.Errorf("start-ok (-want +got)\n%s", diff)
			}
			if got, want := h.Unresolved(), name == "placeholders without configured credentials pass"; got != want {
				t.Errorf("Unresolved() = %v, want %v", got, want)
			}
			gotVhost := ""
			if m := h.Open(&amqpwire.ConnectionOpen{VirtualHost: tc.vhost}); m != nil {
				gotVhost = m.(*amqpwire.ConnectionOpen).VirtualHost
			}
			if gotVhost != tc.wantVhost {
				t.Errorf("vhost = %q, want %q", gotVhost, tc.wantVhost)
			}
		})
	}
}
