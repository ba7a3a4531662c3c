package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseConfig(t *testing.T) {
	defaults := config{url: "amqp://guest:guest@127.0.0.1:5672/", queue: "orders", rate: 10, count: 100, start: 1, declare: true}
	tests := map[string]struct {
		env     map[string]string
		args    []string
		want    config
		wantErr bool
	}{
		"defaults": {want: defaults},
		"flags": {
			args: []string{"-queue", "q", "-rate", "0", "-count", "5", "-start", "7", "-declare=false", "-body-size", "3"},
			want: config{url: defaults.url, queue: "q", rate: 0, count: 5, start: 7, bodySize: 3},
		},
		"env fills in for missing flags": {
			env:  map[string]string{"QUEUE": "from-env", "RATE": "2.5", "COUNT": "9"},
			args: []string{"-count", "3"},
			want: config{url: defaults.url, queue: "from-env", rate: 2.5, count: 3, start: 1, declare: true},
		},
		"bad env":       {env: map[string]string{"RATE": "fast"}, wantErr: true},
		"negative rate": {args: []string{"-rate", "-1"}, wantErr: true},
		"negative size": {args: []string{"-body-size", "-1"}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, k := range []string{"AMQP_URL", "QUEUE", "RATE", "COUNT", "START", "DECLARE", "BODY_SIZE"} {
				t.Setenv(k, "")
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got, err := parseConfig(tc.args)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parseConfig(%q) = %+v, want an error", tc.args, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(config{})); diff != "" {
				t.Errorf("parseConfig(%q) (-want +got):\n%s", tc.args, diff)
			}
		})
	}
}

func TestConfirmBatch(t *testing.T) {
	for rate, want := range map[float64]int{0: 100, 0.5: 1, 10: 1, 16: 2, 250: 25, 5000: 100} {
		if got := confirmBatch(rate); got != want {
			t.Errorf("confirmBatch(%v) = %d, want %d", rate, got, want)
		}
	}
}
