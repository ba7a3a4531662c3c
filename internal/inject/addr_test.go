package inject

import (
	"strings"
	"testing"
)

func TestParseBrokerAddr(t *testing.T) {
	tests := map[string]struct {
		in           string
		wantUpstream string
		wantLocal    string // with host and port replaced by 127.0.0.1:15672
		wantMasked   string
		wantErr      bool
		wantTLS      bool
	}{
		"full URL": {
			in:           "amqp://user:pw@rabbit.default:5673/%2f?heartbeat=10&connection_timeout=5000",
			wantUpstream: "rabbit.default:5673",
			wantLocal:    "amqp://user:pw@127.0.0.1:15672/%2f?heartbeat=10&connection_timeout=5000",
			wantMasked:   "amqp://user:xxxxx@rabbit.default:5673/%2f?heartbeat=10&connection_timeout=5000",
		},
		"no port, no vhost": {
			in:           "amqp://rabbit",
			wantUpstream: "rabbit:5672",
			wantLocal:    "amqp://127.0.0.1:15672",
			wantMasked:   "amqp://rabbit",
		},
		"scheme in capitals, host lower-cased upstream only": {
			in:           "AMQP://Rabbit.Example:5672/",
			wantUpstream: "rabbit.example:5672",
			wantLocal:    "AMQP://127.0.0.1:15672/",
			wantMasked:   "AMQP://Rabbit.Example:5672/",
		},
		"user without password": {
			in:           "amqp://guest@rabbit/",
			wantUpstream: "rabbit:5672",
			wantLocal:    "amqp://guest@127.0.0.1:15672/",
			wantMasked:   "amqp://guest@rabbit/",
		},
		"password with @ and :": {
			in:           "amqp://u:p@ss:w@rabbit:5672/v",
			wantUpstream: "rabbit:5672",
			wantLocal:    "amqp://u:p@ss:w@127.0.0.1:15672/v",
			wantMasked:   "amqp://u:xxxxx@rabbit:5672/v",
		},
		"password from $(VAR) references": {
			in:           "amqp://$(USER):$(PASS)@rabbit:5672/",
			wantUpstream: "rabbit:5672",
			wantLocal:    "amqp://$(USER):$(PASS)@127.0.0.1:15672/",
			wantMasked:   "amqp://$(USER):xxxxx@rabbit:5672/",
		},
		"IPv6": {
			in:           "amqp://u:p@[fd00::10]:5672/",
			wantUpstream: "[fd00::10]:5672",
			wantLocal:    "amqp://u:p@127.0.0.1:15672/",
			wantMasked:   "amqp://u:xxxxx@[fd00::10]:5672/",
		},
		"IPv6 without port": {
			in:           "amqp://[fd00::10]",
			wantUpstream: "[fd00::10]:5672",
			wantLocal:    "amqp://127.0.0.1:15672",
			wantMasked:   "amqp://[fd00::10]",
		},
		"host:port": {
			in:           "rabbit.messaging:5672",
			wantUpstream: "rabbit.messaging:5672",
			wantLocal:    "127.0.0.1:15672",
			wantMasked:   "rabbit.messaging:5672",
		},
		"Spring address with user and vhost": {
			in:           "user:pw@rabbit:5672/orders",
			wantUpstream: "rabbit:5672",
			wantLocal:    "user:pw@127.0.0.1:15672/orders",
			wantMasked:   "user:xxxxx@rabbit:5672/orders",
		},
		"amqps": {
			in: "amqps://u:p@rabbit/", wantTLS: true,
			wantUpstream: "rabbit:5671",
			wantLocal:    "amqps://u:p@127.0.0.1:15672/",
			wantMasked:   "amqps://u:xxxxx@rabbit/",
		},
		"http":               {in: "http://rabbit:15672/", wantErr: true},
		"no host":            {in: "amqp://", wantErr: true},
		"no host, user only": {in: "amqp://u:p@/vhost", wantErr: true},
		"port 0":             {in: "amqp://rabbit:0/", wantErr: true},
		"port too big":       {in: "amqp://rabbit:70000/", wantErr: true},
		"empty port":         {in: "amqp://rabbit:/", wantErr: true},
		"host from $(VAR)":   {in: "amqp://u:p@$(RABBIT_HOST):5672/", wantErr: true},
		"host with space":    {in: "amqp://rab bit/", wantErr: true},
		"IPv6 unclosed":      {in: "amqp://[fd00::10/", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			a, err := parseBrokerAddr(tt.in)
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("parseBrokerAddr(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if a.isTLS() != tt.wantTLS {
				t.Errorf("parseBrokerAddr(%q).isTLS() = %v, want %v", tt.in, a.isTLS(), tt.wantTLS)
			}
			if got := a.upstream(); got != tt.wantUpstream {
				t.Errorf("upstream() = %q, want %q", got, tt.wantUpstream)
			}
			if got := a.withHostPort(localhost, 15672).String(); got != tt.wantLocal {
				t.Errorf("rewritten = %q, want %q", got, tt.wantLocal)
			}
			if got, want := a.plain(localhost, 15672).String(), strings.Replace(tt.wantLocal, "amqps://", "amqp://", 1); got != want {
				t.Errorf("plain() = %q, want %q", got, want)
			}
			if got := a.masked(); got != tt.wantMasked {
				t.Errorf("masked() = %q, want %q", got, tt.wantMasked)
			}
			if got := a.String(); got != tt.in {
				t.Errorf("String() = %q, want the input back, %q", got, tt.in)
			}
		})
	}
}

func TestIsLoopback(t *testing.T) {
	for in, want := range map[string]bool{
		"amqp://localhost":      true,
		"amqp://LOCALHOST:5672": true,
		"amqp://127.0.0.1:5672": true,
		"amqp://127.1.2.3":      true,
		"amqp://[::1]:5672":     true,
		"amqp://10.0.0.1:5672":  false,
		"amqp://rabbit":         false,
	} {
		a, err := parseBrokerAddr(in)
		if err != nil {
			t.Fatalf("parseBrokerAddr(%q): %v", in, err)
		}
		if got := a.isLoopback(); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestMaskValue(t *testing.T) {
	for in, want := range map[string]string{
		"amqps://u:secret@rabbit:5671/":       "amqps://u:xxxxx@rabbit:5671/",
		"u:a@rabbit-0:5672,u:b@rabbit-1:5672": "u:xxxxx@rabbit-0:5672,u:xxxxx@rabbit-1:5672",
		"rabbit-0:5672, rabbit-1:5672":        "rabbit-0:5672, rabbit-1:5672",
		"not a url":                           "not a url",
		"http://u:p@host/path@with-at":        "http://u:xxxxx@host/path@with-at",
		"amqp://user@host/":                   "amqp://user@host/",
	} {
		if got := maskValue(in); got != want {
			t.Errorf("maskValue(%q) = %q, want %q", in, got, want)
		}
	}
}
