package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseFlags(t *testing.T) {
	tests := map[string]struct {
		args    []string
		want    options
		wantErr string
	}{
		"defaults": {want: options{rate: 10, messages: 300, work: 50 * time.Millisecond, warmup: 10 * time.Second, state: "/var/tmp/ms2m-demo"}},
		"all set": {args: []string{"-keep", "-rate", "15", "-messages", "600", "-work", "20ms", "-warmup", "5s", "-state", "/tmp/x"},
			want: options{keep: true, rate: 15, messages: 600, work: 20 * time.Millisecond, warmup: 5 * time.Second, state: "/tmp/x"}},
		"no rate":           {args: []string{"-rate", "0"}, wantErr: "-rate 0"},
		"sub-ms work":       {args: []string{"-work", "1500us"}, wantErr: "whole milliseconds"},
		"done before start": {args: []string{"-messages", "100"}, wantErr: "raise -messages or lower -warmup"},
		"stray argument":    {args: []string{"now"}, wantErr: "unexpected arguments"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(options{})); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}
