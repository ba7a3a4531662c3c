package sidecar_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/ms2m/ms2m/internal/upstream"
)

// TestSidecarOverTLS: an unmodified client that talks plain AMQP to the
// sidecar with the placeholder credentials the webhook gives it reaches
// the broker's TLS port through the sidecar, which verifies the broker,
// puts the real credentials (or EXTERNAL) into the handshake, fails over
// past a broker that is down, and writes the replay log over stream TLS.
func TestSidecarOverTLS(t *testing.T) {
	b := testenv.RequireTLSBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	placeholder := "amqp://" + upstream.PlaceholderUser + ":" + upstream.PlaceholderPassword + "@"

	tests := map[string]struct {
		set     func(*sidecar.Config)
		appURL  string // the app's URL, without the sidecar's address
		wantErr string // "" when the app must consume through the sidecar; else in the sidecar's log
	}{
		"amqps URI from a Secret, placeholders replaced": {
			set:    func(c *sidecar.Config) { c.Upstream = "amqps://guest:guest@localhost:5671/" },
			appURL: placeholder,
		},
		"Spring list, first broker down, TLS on, credentials by variable": {
			set: func(c *sidecar.Config) {
				c.Upstream = dead + "," + b.AMQPAddr
				c.UpstreamTLS = true
				c.UpstreamTLSServerName = "localhost"
				c.UpstreamUsername, c.UpstreamPassword, c.UpstreamVirtualHost = "guest", "guest", "/"
			},
			appURL: placeholder,
		},
		"EXTERNAL with the client certificate": {
			set: func(c *sidecar.Config) {
				c.Upstream = "amqps://localhost:5671"
				c.UpstreamAuth = upstream.MechanismEXTERNAL
				c.UpstreamTLSCertFile, c.UpstreamTLSKeyFile = b.ClientCert, b.ClientKey
			},
			appURL: placeholder,
		},
		"Spring application.properties mounted, TLS and credentials from it": {
			set: func(c *sidecar.Config) {
				c.Upstream = ""
				props := filepath.Join(t.TempDir(), "application.properties")
				text := "spring.rabbitmq.host=localhost\nspring.rabbitmq.port=5671\nspring.rabbitmq.ssl.enabled=true\nspring.rabbitmq.username=guest\nspring.rabbitmq.password=guest\n"
				if err := os.WriteFile(props, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
				c.AppConfigFiles = props
			},
			appURL: placeholder,
		},
		"Spring env from envFrom, first broker down": {
			set: func(c *sidecar.Config) {
				c.Upstream = ""
				c.AppEnv = map[string]string{"SPRING_RABBITMQ_ADDRESSES": "guest:guest@" + dead + ",guest:guest@localhost:5671", "SPRING_RABBITMQ_SSL_ENABLED": "true"}
			},
			appURL: placeholder,
		},
		"the app's own credentials pass": {
			set:    func(c *sidecar.Config) { c.Upstream = "amqps://localhost:5671" },
			appURL: "amqp://guest:guest@",
		},
		"wrong server name refused": {
			set: func(c *sidecar.Config) {
				c.Upstream = "amqps://guest:guest@localhost:5671/"
				c.UpstreamTLSServerName = "wrong-name.invalid"
				c.UpstreamConnectTimeout = time.Second
			},
			appURL:  placeholder,
			wantErr: "certificate is valid for localhost, not wrong-name.invalid",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config()
			cfg.UpstreamTLSCAFile = b.CAFile
			cfg.StreamURI = "rabbitmq-stream+tls://guest:guest@localhost:5551/"
			tc.set(&cfg)
			var logs syncBuffer
			sc := e.startConfig(cfg, sidecar.Options{Logger: slog.New(slog.NewTextHandler(io.MultiWriter(&logs, os.Stderr), nil))})
			c, err := amqp.DialConfig(tc.appURL+sc.AMQPAddr()+"/", amqp.Config{})
			if tc.wantErr != "" {
				if err == nil {
					c.Close()
					t.Fatal("the app connected; want the sidecar to refuse the broker's certificate")
				}
				if !strings.Contains(logs.String(), tc.wantErr) {
					t.Fatalf("the sidecar's log does not say %q", tc.wantErr)
				}
				if strings.Contains(logs.String(), "guest:guest") {
					t.Fatal("the sidecar's log shows the broker's password")
				}
				return
			}
			if err != nil {
				t.Fatalf("the app connects through the sidecar: %v", err)
			}
			t.Cleanup(func() { c.Close() })
			q := e.queue()
			e.publish(q, "m1", "m2", "m3")
			ch, err := c.Channel()
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := ch.Consume(q, "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				select {
				case m := <-msgs:
					if err := m.Ack(false); err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("delivery %d did not come through the sidecar", i+1)
				}
			}
			recs := tlsRecords(t, e, b)
			if got := deliveries(t, recs, 1); len(got) != 3 || string(got[2].Body) != "m3" {
				t.Fatalf("the replay log over stream TLS holds %d deliveries; want m1, m2, m3", len(got))
			}
		})
	}
}

// tlsRecords reads the test's replay log through the stream TLS port.
func tlsRecords(t *testing.T, e *env, b testenv.TLSBroker) []shadowqueue.Record {
	t.Helper()
	tc, err := upstream.ClientTLS(&upstream.TLS{CAFile: b.CAFile}, "localhost:5551")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	l, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: "rabbitmq-stream+tls://guest:guest@localhost:5551/", TLS: tc, Name: e.log})
	if err != nil {
		t.Fatalf("open the replay log over TLS: %v", err)
	}
	defer l.Close()
	recs, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatalf("read the replay log over TLS: %v", err)
	}
	return recs
}
