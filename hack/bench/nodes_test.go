package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseBallast(t *testing.T) {
	for name, tc := range map[string]struct {
		out       string
		wantRSS   int
		wantReady bool
	}{
		"nothing yet":     {out: "", wantRSS: -1},
		"stats, no ready": {out: "ballast mb=8 rss_kib=10240\n", wantRSS: 10240},
		"ready":           {out: "ballast mb=96 rss_kib=101108\nready\n", wantRSS: 101108, wantReady: true},
		"ready, no CR":    {out: "ballast mb=0 rss_kib=1800\nready", wantRSS: 1800, wantReady: true},
	} {
		t.Run(name, func(t *testing.T) {
			rss, ready := parseBallast(tc.out)
			if rss != tc.wantRSS || ready != tc.wantReady {
				t.Errorf("parseBallast(%q) = %d, %v; want %d, %v", tc.out, rss, ready, tc.wantRSS, tc.wantReady)
			}
		})
	}
}

func TestNodeFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args    []string
		want    nodeOptions
		wantErr bool
	}{
		"defaults": {want: nodeOptions{stateDir: "/var/tmp/ms2m-bench", criuRounds: 3, criuMB: []int{8, 96, 1000},
			strategyRounds: 3, strategyRates: []float64{4, 10, 16}, strategyWarmup: 10e9}},
		"quick": {args: []string{"-quick"}, want: nodeOptions{stateDir: "/var/tmp/ms2m-bench", criuRounds: 1, criuMB: []int{8, 96, 1000},
			strategyRounds: 1, strategyRates: []float64{4, 10, 16}, strategyWarmup: 10e9}},
		"quick, rounds set": {args: []string{"-quick", "-strategy-rounds", "2", "-criu-mb", "8", "-criu-big"}, want: nodeOptions{stateDir: "/var/tmp/ms2m-bench", criuRounds: 1, criuMB: []int{8}, criuBig: true,
			strategyRounds: 2, strategyRates: []float64{4, 10, 16}, strategyWarmup: 10e9}},
		"rate at the service rate": {args: []string{"-strategy-rates", "4,20"}, wantErr: true},
		"negative size":            {args: []string{"-criu-mb", "-1"}, wantErr: true},
		"no rounds":                {args: []string{"-criu-rounds", "0"}, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseFlags(%q): err %v, want error %v", tc.args, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tc.want, o.nodes, cmp.AllowUnexported(nodeOptions{})); diff != "" {
				t.Errorf("parseFlags(%q).nodes (-want +got):\n%s", tc.args, diff)
			}
		})
	}
}

func TestMarkerTimes(t *testing.T) {
	const log = `time="2026-12-02T16:46:03.794475866Z" level=info msg="RunPodSandbox for name:\"p-restored\"  namespace:\"default\""
time="2026-12-02T16:46:03.936563503Z" level=info msg="RunPodSandbox for name:\"p-restored\"  namespace:\"default\" returns sandbox id \"b34d\""
not a containerd line
time="2026-12-02T16:46:13.353644752Z" level=info msg="Pulled image \"reg/x@sha256:ae\" with image id \"sha256:00\""
time="2026-12-02T16:46:16.576294113Z" level=info msg="CreateContainer within sandbox \"b34d\" for name:\"ballast\" returns container id \"f39d\""
`
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	sandbox := []string{`RunPodSandbox for name:\"p-restored\"`, "returns sandbox id"}
	pulled := []string{`Pulled image \"reg/x@sha256:ae\"`}
	create := []string{"CreateContainer within sandbox", "returns container id"}
	for name, tc := range map[string]struct {
		since   time.Time
		markers [][]string
		want    []time.Time
	}{
		"all found, in order": {since: at("2026-12-02T16:46:00Z"), markers: [][]string{sandbox, pulled, create},
			want: []time.Time{at("2026-12-02T16:46:03.936563503Z"), at("2026-12-02T16:46:13.353644752Z"), at("2026-12-02T16:46:16.576294113Z")}},
		"lines before since are not counted": {since: at("2026-12-02T16:46:05Z"), markers: [][]string{sandbox, pulled}},
		"a missing marker gives nil":         {since: at("2026-12-02T16:46:00Z"), markers: [][]string{sandbox, {"StartContainer for"}}},
		"order matters":                      {since: at("2026-12-02T16:46:00Z"), markers: [][]string{create, pulled}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, markerTimes(log, tc.since, tc.markers...)); diff != "" {
				t.Errorf("markerTimes (-want +got):\n%s", diff)
			}
		})
	}
}
