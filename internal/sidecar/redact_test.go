package sidecar_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/sidecar"
)

// badURIs are stream URIs that url.Parse rejects or misreads, each with the
// password it holds. Each is a mistake an operator makes: an unescaped '%',
// '/', '#' or '@' in the password.
var badURIs = map[string]struct{ uri, password string }{
	"invalid escape":      {"rabbitmq-stream://ms2m:Zq7%zzkP4m@127.0.0.1:1/", "Zq7%zzkP4m"},
	"slash in password":   {"rabbitmq-stream://ms2m:Zq7/xWkP4m@127.0.0.1:1/", "Zq7/xWkP4m"},
	"hash in password":    {"rabbitmq-stream://ms2m:Zq7#xWkP4m@127.0.0.1:1/", "Zq7#xWkP4m"},
	"control character":   {"rabbitmq-stream://ms2m:Zq7xWkP4m\x7f@127.0.0.1:1/", "Zq7xWkP4m"},
	"space in the scheme": {"rabbit mq-stream://ms2m:Zq7xWkP4m@127.0.0.1:1/", "Zq7xWkP4m"},
}

// leaked reports the password, or a 4-byte run of it, that s shows.
func leaked(s, password string) string {
	for i := 0; i+4 <= len(password); i++ {
		if strings.Contains(s, password[i:i+4]) {
			return password[i : i+4]
		}
	}
	return ""
}

// TestConfigErrorsHideThePassword: a stream URI that does not parse is
// refused with a message that names MS2M_STREAM_URI and shows no part of
// the password (it used to quote the whole URI).
func TestConfigErrorsHideThePassword(t *testing.T) {
	for name, tc := range badURIs {
		t.Run(name, func(t *testing.T) {
			t.Setenv("MS2M_UPSTREAM", "127.0.0.1:5672")
			t.Setenv("MS2M_STREAM_URI", tc.uri)
			t.Setenv("MS2M_LOG_NAME", "shop.orders-0")
			t.Setenv("MS2M_CONTROL_TOKEN", "t")
			_, err := sidecar.LoadConfig()
			if err == nil {
				// Some of these parse: then the sidecar reads them at start
				// (TestStartErrorsHideThePassword).
				return
			}
			if !strings.Contains(err.Error(), "MS2M_STREAM_URI") {
				t.Errorf("LoadConfig() error = %v, want one naming MS2M_STREAM_URI", err)
			}
			if s := leaked(err.Error(), tc.password); s != "" {
				t.Errorf("LoadConfig() error = %q shows %q of the password", err, s)
			}
		})
	}
}

// TestStartErrorsHideThePassword: a sidecar started with a stream URI that
// does not parse fails, and neither its error nor its logs show the password.
func TestStartErrorsHideThePassword(t *testing.T) {
	for name, tc := range badURIs {
		for _, target := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				var logs bytes.Buffer
				logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				cfg := sidecar.Config{
					Listen: "127.0.0.1:0", Upstream: "127.0.0.1:1", UpstreamConnectTimeout: time.Second,
					StreamURI: tc.uri, LogName: "shop.orders-0", ControlListen: "127.0.0.1:0", ControlToken: "t",
					DrainTimeout: time.Second, LogLevel: "debug",
				}
				if target {
					cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
				}
				// Start retries until ctx ends: give it time for a few tries.
				ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
				defer cancel()
				sc, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: logger})
				if err == nil {
					sc.Close()
					t.Fatalf("Start with stream URI %q succeeded, want an error", tc.uri)
				}
				if s := leaked(err.Error(), tc.password); s != "" {
					t.Errorf("Start error = %q shows %q of the password", err, s)
				}
				if s := leaked(logs.String(), tc.password); s != "" {
					t.Errorf("the sidecar's logs show %q of the password:\n%s", s, logs.String())
				}
				if !strings.Contains(logs.String()+err.Error(), "does not parse") {
					t.Errorf("neither the error (%v) nor the logs say the URI does not parse:\n%s", err, logs.String())
				}
			})
		}
	}
}
