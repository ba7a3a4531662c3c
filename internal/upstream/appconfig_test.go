package upstream_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/upstream"
)

func TestResolveAppSettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	props := write("application.properties", "# the app's own\nspring.rabbitmq.host = rabbit.prod\nspring.rabbitmq.port: 5671\nspring.rabbitmq.ssl.enabled=true\n"+
		"spring.rabbitmq.username=ledger\nspring.rabbitmq.password=s3cr\\\n  et\nspring.rabbitmq.virtual-host=prod\n")
	yml := write("application.yml", "spring:\n  rabbitmq:\n    addresses: r0:5671,r1:5671\n    ssl:\n      enabled: true\n    username: ledger\n---\nspring:\n  config:\n    activate:\n      on-profile: dev\n  rabbitmq:\n    addresses: localhost\n")
	tests := map[string]struct {
		in      upstream.AppSettings
		want    upstream.Resolved
		wantErr string
	}{
		"URL from envFrom": {
			in:   upstream.AppSettings{Env: map[string]string{"AMQP_URL": "amqps://u:p@rabbit/"}},
			want: upstream.Resolved{Spec: "amqps://u:p@rabbit/", From: "AMQP_URL"},
		},
		"properties file": {
			in:   upstream.AppSettings{Files: []string{props}},
			want: upstream.Resolved{Spec: "rabbit.prod:5671", TLS: true, Username: "ledger", Password: "s3cret", VirtualHost: "prod", From: "spring.rabbitmq.host"},
		},
		"env beats the file": {
			in:   upstream.AppSettings{Files: []string{props}, Env: map[string]string{"SPRING_RABBITMQ_HOST": "rabbit.env", "SPRING_RABBITMQ_VIRTUALHOST": "envhost"}},
			want: upstream.Resolved{Spec: "rabbit.env:5671", TLS: true, Username: "ledger", Password: "s3cret", VirtualHost: "envhost", From: "SPRING_RABBITMQ_HOST"},
		},
		"YAML, a profile's document skipped, missing file skipped": {
			in:   upstream.AppSettings{Files: []string{filepath.Join(dir, "absent.properties"), yml}},
			want: upstream.Resolved{Spec: "r0:5671,r1:5671", TLS: true, Username: "ledger", From: "spring.rabbitmq.addresses"},
		},
		"Spring's defaults": {
			in:   upstream.AppSettings{Env: map[string]string{"SPRING_RABBITMQ_HOST": "rabbit"}},
			want: upstream.Resolved{Spec: "rabbit:5672", Username: "guest", Password: "guest", From: "SPRING_RABBITMQ_HOST"},
		},
		"nothing": {in: upstream.AppSettings{Env: map[string]string{"QUEUE": "q"}}, wantErr: "name no broker"},
		"bad YAML not shown": {
			in:      upstream.AppSettings{Files: []string{write("bad.yml", "password: [s3cret\n")}},
			wantErr: "not valid YAML",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tc.in.Resolve()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error = %v, want one containing %q and no password", err, tc.wantErr)
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
